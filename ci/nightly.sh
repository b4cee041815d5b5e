#!/usr/bin/env bash
# One lane of the nightly parity matrix (.github/workflows/nightly.yml): set up, run pytest on the lane's scenario
# files, keep everything in parity-out/LANE/ (results.jsonl, summary.md, junit.xml, pytest.log) for the artifact.
#
#   ci/nightly.sh DEVICE LANE     DEVICE: npu (self-hosted Ascend runner) or cpu (GitHub-hosted ubuntu)
#
# Environment: PARITY_FILES   scenario files, space-separated (required)
#              PARITY_MARKERS pytest -m expression (default: nightly; set it empty to run every scenario)
#              PARITY_SELECT  the lane's own pytest -k expression on scenario ids (optional)
#              PARITY_K       a further -k expression, e.g. from a manual dispatch (optional; ANDed)
#              PARITY_WORKERS pytest-xdist workers (default 1): >1 runs scenarios side by side, each leasing its
#                             own cards (harness/run/cards.py), e.g. two 8-card scenarios on a 16-card node
# Fails when pytest fails, collects nothing, or skips every scenario it collected: a nightly that ran nothing
# (say, a model-path variable missing on the runner) must not be green.
set -euo pipefail
usage="usage: ci/nightly.sh npu|cpu LANE"
device=${1:?$usage}
lane=${2:?$usage}
cd "$(dirname "$0")/.."
venv="${RUNNER_TEMP:-$(mktemp -d)}/parity-venv-$lane"
out="parity-out/$lane"
summary=${GITHUB_STEP_SUMMARY:-/dev/null}

case "$device" in
  npu)
    # CANN: verl's images export it in login shells only (/etc/profile.d); a step's `bash` is not one, so source the
    # toolkit (CANN <= 8.x: ascend-toolkit, newer: cann) and ATB scripts that exist.
    for env_script in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/cann/set_env.sh \
      /usr/local/Ascend/nnal/atb/set_env.sh; do
      # shellcheck disable=SC1090
      if [ -f "$env_script" ]; then set +eu; . "$env_script"; set -eu; fi
    done
    # torch, torch_npu and MindSpeed come from the image: keep them visible and install only the harness
    # (no CPU constraints here: they pin the CPU torch). Pin torch to the image's own build, so that pip fails
    # loudly instead of replacing it with a PyPI torch that torch_npu was not built against.
    python3 -m venv --clear --system-site-packages "$venv"
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
    python -c 'from importlib.metadata import version; print("torch==" + version("torch"))' >"$venv/image-torch.txt"
    pip install --progress-bar off -e . -c "$venv/image-torch.txt"
    python -c 'import torch, torch_npu
print("torch", torch.__version__, "torch_npu", torch_npu.__version__, "NPUs", torch_npu.npu.device_count())'
    ;;
  cpu)
    bash ci/install_cpu.sh "$venv"
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
    ;;
  *)
    echo "ci/nightly.sh: unknown device '$device'; $usage" >&2
    exit 2
    ;;
esac

read -ra files <<<"${PARITY_FILES:?PARITY_FILES must name the scenario files of the lane}"
args=(--parity-device "$device" --parity-out "$out" --junitxml "$out/junit.xml")
markers=${PARITY_MARKERS-nightly}
if [ -n "$markers" ]; then args+=(-m "$markers"); fi
select=${PARITY_SELECT:-}
if [ -n "$select" ] && [ -n "${PARITY_K:-}" ]; then
  select="($select) and ($PARITY_K)"
else
  select="$select${PARITY_K:-}"
fi
if [ -n "$select" ]; then args+=(-k "$select"); fi
workers=${PARITY_WORKERS:-1}
if [ "$workers" -gt 1 ]; then args+=(-n "$workers"); fi
mkdir -p "$out"
echo "lane $lane: pytest ${args[*]} ${files[*]}"

rc=0
# pipefail: the status is pytest's, not tee's (verl's nightly lost crashes exactly here).
python -m pytest "${args[@]}" "${files[@]}" 2>&1 | tee "$out/pytest.log" || rc=$?

why=""
if [ "$rc" -eq 5 ]; then
  why="pytest collected no scenarios (exit 5) from ${files[*]} with -m '$markers' -k '$select'"
elif [ "$rc" -ne 0 ]; then
  why="pytest exited with $rc"
elif ! python - "$out/junit.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
tests = sum(int(s.get("tests", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(f"junit: {tests} collected, {skipped} skipped, {tests - skipped} ran")
sys.exit(0 if tests > skipped else 1)
PY
then
  why="every collected scenario was SKIPPED, nothing ran (the skip reasons are in pytest.log)"
fi

if [ -n "$why" ]; then
  echo "::error title=nightly lane $lane::$why"
  {
    # shellcheck disable=SC2016  # the backticks are Markdown
    printf '### Nightly lane `%s`: FAILED\n\n%s\n\n<details><summary>last lines of pytest.log</summary>\n\n```\n' \
      "$lane" "$why"
    tail -n 40 "$out/pytest.log"
    printf '```\n</details>\n'
  } >>"$summary"
  exit 1
fi
