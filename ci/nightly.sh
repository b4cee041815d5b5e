#!/usr/bin/env bash
# One lane of the nightly parity matrix (.github/workflows/nightly.yml): set up, run pytest on the lane's scenario
# files, keep everything in parity-out/LANE/ (results.jsonl, summary.md, junit.xml, pytest.log) for the artifact.
#
#   ci/nightly.sh DEVICE LANE     DEVICE: npu (self-hosted Ascend runner) or cpu (GitHub-hosted ubuntu)
#
# Environment: PARITY_FILES      scenario files, space-separated (required)
#              PARITY_MARKERS    pytest -m expression (default: nightly; set it empty to run every scenario)
#              PARITY_SELECT     the lane's own pytest -k expression on scenario ids (optional)
#              PARITY_K          a further -k expression, e.g. from a manual dispatch (optional; ANDed)
#              PARITY_WORKERS    scenarios run side by side (default 1), each pytest process a shard of the lane
#                                (--parity-shard I/N) leasing its own cards (harness/run/cards.py), e.g. two 8-card
#                                scenarios on a 16-card node
#              PARITY_HCCL_OP_EXPANSION_MODE  exported as HCCL_OP_EXPANSION_MODE (verl's MoE jobs: AIV)
#              PARITY_HCCL_HOST_PORTS, PARITY_HCCL_NPU_PORTS
#                                one HCCL port range per worker ("60000-60099 60100-60199"): each concurrent
#                                scenario's HCCL gets its own HCCL_HOST_SOCKET_PORT_RANGE / HCCL_NPU_SOCKET_PORT_RANGE
#                                (required with PARITY_WORKERS > 1 on npu)
#              PARITY_STACK      cpu: the lane's own stack, a constraints file and what to install with it
#                                (ci/install_cpu.sh's arguments; default: the CPU stack), e.g. verl's lane:
#                                "ci/constraints-verl.txt -e .[dev,verl]"
#              PARITY_REQUIRE    1: every row the lane selects must run (--parity-require FILE), a SKIP other than
#                                `broken:` is an ERROR (default: 1 on npu, 0 on cpu)
#              PARITY_PREVIOUS_OUT the previous night's out dir of this lane (optional): rows that flipped PASS -> FAIL
#                                while their upstream source tree moved are bisected (`parity bisect --flipped`)
#              PARITY_WHEELHOUSE npu: the wheelhouse the lane installs from, with no package index (default:
#                                wheelhouse/, the workflow's parity-wheelhouse artifact built by ci/wheelhouse.sh)
# On npu (and where PARITY_REQUIRE=1) every row the lane selects must run (--parity-require FILE): a row that would
# SKIP (a model path unset or empty, a package missing from the image) is an ERROR. Fails when pytest fails,
# collects nothing, or skips every scenario, and when any row's golden is absent ("no golden: N rows of lane LANE
# not run", first in the summary): a nightly that ran nothing, or ran against nothing, must not be green.
set -euo pipefail
usage="usage: ci/nightly.sh npu|cpu LANE"
device=${1:?$usage}
lane=${2:?$usage}
cd "$(dirname "$0")/.."
venv="${RUNNER_TEMP:-$(mktemp -d)}/parity-venv-$lane"
out="parity-out/$lane"
summary=${GITHUB_STEP_SUMMARY:-/dev/null}

fail() {
  echo "::error title=nightly lane $lane::$1"
  {
    # shellcheck disable=SC2016  # the backticks are Markdown
    printf '### Nightly lane `%s`: FAILED\n\n%s\n\n' "$lane" "$1"
    if [ -f "$out/pytest.log" ]; then
      printf '<details><summary>last lines of pytest.log</summary>\n\n```\n'
      tail -n 40 "$out/pytest.log"
      printf '```\n</details>\n'
    fi
  } >>"$summary"
  exit 1
}

read -ra files <<<"${PARITY_FILES:?PARITY_FILES must name the scenario files of the lane}"
args=(--parity-device "$device")
case "$device" in
  npu)
    # CANN: verl's images export it in login shells only (/etc/profile.d); a step's `bash` is not one, so source the
    # toolkit (CANN <= 8.x: ascend-toolkit, newer: cann) and ATB scripts that exist.
    for env_script in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/cann/set_env.sh \
      /usr/local/Ascend/nnal/atb/set_env.sh; do
      # shellcheck disable=SC1090
      if [ -f "$env_script" ]; then set +eu; . "$env_script"; set -eu; fi
    done
    # torch, torch_npu, MindSpeed and Megatron come from the image: keep them visible and install the harness from
    # the wheelhouse alone (--no-index: no package index is reached from the image, whatever PIP_INDEX_URL the
    # runner sets), pinning torch to the image's own build so that nothing replaces what torch_npu was built for.
    wheelhouse=${PARITY_WHEELHOUSE:-wheelhouse}
    [ -d "$wheelhouse" ] || fail "no wheelhouse at $wheelhouse (the parity-wheelhouse artifact, ci/wheelhouse.sh)"
    # --without-pip: on a Python 3.11 image a venv's own seed (pip + setuptools 65) would shadow the image's
    # setuptools, which torch requires newer (torch 2.13: setuptools>=77.0.3), and pip would then look for it in
    # the wheelhouse; the image's pip installs into the venv as well (the venv's python runs it)
    python3 -m venv --clear --system-site-packages --without-pip "$venv"
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
    python -c 'from importlib.metadata import version; print("torch==" + version("torch"))' >"$venv/image-torch.txt"
    python -m pip install --progress-bar off --no-index --find-links "$wheelhouse" -c "$venv/image-torch.txt" parity-harness \
      || fail "installing the harness from $wheelhouse without a package index failed (above): the image lacks a \
dependency the wheelhouse does not carry for its Python / platform"
    python ci/check_install.py || fail "the installed harness cannot import what it needs (above)"
    python -c 'import torch, torch_npu
print("torch", torch.__version__, "torch_npu", torch_npu.__version__, "NPUs", torch_npu.npu.device_count())'
    ;;
  cpu)
    read -ra stack <<<"${PARITY_STACK:-}"
    bash ci/install_cpu.sh "$venv" "${stack[@]}"
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
    ;;
  *)
    echo "ci/nightly.sh: unknown device '$device'; $usage" >&2
    exit 2
    ;;
esac

default_require=0
if [ "$device" = npu ]; then default_require=1; fi
if [ "${PARITY_REQUIRE:-$default_require}" = 1 ]; then
  for file in "${files[@]}"; do
    if [[ "$file" == *.yaml ]]; then args+=(--parity-require "$file"); fi  # a test module has no rows to require
  done
fi
markers=${PARITY_MARKERS-nightly}
if [ -n "$markers" ]; then args+=(-m "$markers"); fi
select=${PARITY_SELECT:-}
if [ -n "$select" ] && [ -n "${PARITY_K:-}" ]; then
  select="($select) and ($PARITY_K)"
else
  select="$select${PARITY_K:-}"
fi
if [ -n "$select" ]; then args+=(-k "$select"); fi
# the previous night (the workflow fetches this lane's artifact of its newest earlier run: ci/fetch_artifact.py
# --previous): the terminal summary, summary.md and report.html say what changed since it (versions, verdicts)
history=()
if [ -n "${PARITY_PREVIOUS_OUT:-}" ]; then
  if [ -f "$PARITY_PREVIOUS_OUT/results.jsonl" ]; then
    history=(--history "$PARITY_PREVIOUS_OUT")
    args+=(--parity-history "$PARITY_PREVIOUS_OUT")
  else
    echo "::notice title=nightly lane $lane::PARITY_PREVIOUS_OUT=$PARITY_PREVIOUS_OUT holds no results.jsonl: no comparison with the previous night"
  fi
fi
workers=${PARITY_WORKERS:-1}
# HCCL's collective expansion mode per lane (verl's MoE jobs: AIV); unset leaves HCCL's default
if [ -n "${PARITY_HCCL_OP_EXPANSION_MODE:-}" ]; then export HCCL_OP_EXPANSION_MODE=$PARITY_HCCL_OP_EXPANSION_MODE; fi
read -ra host_ports <<<"${PARITY_HCCL_HOST_PORTS:-}"
read -ra npu_ports <<<"${PARITY_HCCL_NPU_PORTS:-}"
if [ "$device" = npu ] && [ "$workers" -gt 1 ] && { [ "${#host_ports[@]}" -lt "$workers" ] ||
  [ "${#npu_ports[@]}" -lt "$workers" ]; }; then
  fail "PARITY_WORKERS=$workers scenarios at once need one HCCL port range each: PARITY_HCCL_HOST_PORTS has \
${#host_ports[@]}, PARITY_HCCL_NPU_PORTS ${#npu_ports[@]}"
fi
rm -rf "$out"
mkdir -p "$out"
export PARITY_LANE=$lane # the reports name the lane where rows await a golden (reports/publish.py)

# One pytest per worker, each a shard of the lane with its own out dir and HCCL port ranges; pipefail: the status
# is pytest's, not tee's (verl's nightly lost crashes exactly here).
run_worker() {
  local index=$1 dir=$2
  shift 2
  local env=()
  if [ "${#host_ports[@]}" -ge "$index" ]; then env+=("HCCL_HOST_SOCKET_PORT_RANGE=${host_ports[$((index - 1))]}"); fi
  if [ "${#npu_ports[@]}" -ge "$index" ]; then env+=("HCCL_NPU_SOCKET_PORT_RANGE=${npu_ports[$((index - 1))]}"); fi
  echo "lane $lane worker $index: ${env[*]} pytest $* --parity-out $dir ${files[*]}"
  # -P: the checkout's own parity/ folder (the package root of an editable install) must not shadow the harness
  # installed from the wheelhouse, which `python -m` would put behind the working directory
  env "${env[@]}" python -P -m pytest "$@" --parity-out "$dir" --junitxml "$dir/junit.xml" "${files[@]}" 2>&1 |
    tee "$dir/pytest.log"
}

rc=0
if [ "$workers" -le 1 ]; then
  run_worker 1 "$out" "${args[@]}" || rc=$?
else
  pids=()
  for index in $(seq 1 "$workers"); do
    mkdir -p "$out/shard-$index"
    run_worker "$index" "$out/shard-$index" "${args[@]}" --parity-shard "$index/$workers" &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do
    worker_rc=0
    wait "$pid" || worker_rc=$?
    # exit 5 (nothing collected) in one shard is not a failure while another shard ran rows
    if [ "$worker_rc" -ne 0 ] && [ "$worker_rc" -ne 5 ] && [ "$rc" -eq 0 ]; then rc=$worker_rc; fi
  done
  cat "$out"/shard-*/pytest.log >"$out/pytest.log"
  shards=()
  for dir in "$out"/shard-*; do [ -f "$dir/results.jsonl" ] && shards+=("$dir"); done
  if [ "${#shards[@]}" -gt 0 ]; then
    report_rc=0
    parity report "${shards[@]}" --out "$out" "${history[@]}" || report_rc=$?
    if [ "$report_rc" -gt 1 ]; then fail "merging the shards' results failed (parity report exit $report_rc)"; fi
  fi
fi

# A row run against an upstream source tree (PARITY_VERL_SRC, a MindSpeed or Megatron-LM clone) that flipped
# PASS -> FAIL since the previous night (PARITY_PREVIOUS_OUT: that night's out dir of this lane) is bisected over the
# tree's commits between the two nights; the first bad commit goes into this lane's report (harness/bisect.py).
if [ "${#history[@]}" -gt 0 ] && [ -f "$out/results.jsonl" ]; then
  parity bisect --flipped "$out" --history "$PARITY_PREVIOUS_OUT" ||
    echo "::warning title=nightly lane $lane::parity bisect --flipped failed (the report has no first bad commit)"
fi

if [ "$rc" -eq 5 ]; then
  fail "pytest collected no scenarios (exit 5) from ${files[*]} with -m '$markers' -k '$select'"
fi
# What the rows did (junit.xml): a row whose golden is absent ran against nothing, SKIP or (required) ERROR, and
# fails the lane naming itself first (exit 3, its line last); a lane that skipped every row fails too (exit 1).
rows_rc=0
rows=$(python -P - "$out" "$lane" <<'PY'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from parity.harness.config.validate import NO_GOLDEN
from parity.reports.table import no_golden_line

tests = skipped = awaiting = 0
for junit in Path(sys.argv[1]).glob("**/junit.xml"):
    root = ET.parse(junit).getroot()
    for suite in [root] if root.tag == "testsuite" else root.findall("testsuite"):
        tests += int(suite.get("tests", 0))
        skipped += int(suite.get("skipped", 0))
        # harness/config/validate.py missing_golden: the reason of a SKIP, or of a required row's ERROR (a failure)
        awaiting += sum(any(f"{NO_GOLDEN}: " in (o.get("message") or "") + (o.text or "") for o in case
                            if o.tag in ("skipped", "failure", "error")) for case in suite.iter("testcase"))
print(f"junit: {tests} collected, {skipped} skipped, {awaiting} without their golden, {tests - skipped} ran")
if awaiting:
    print(no_golden_line(awaiting, sys.argv[2]))
    sys.exit(3)
sys.exit(0 if tests > skipped else 1)
PY
) || rows_rc=$?
printf '%s\n' "$rows"
if [ "$rows_rc" -eq 3 ]; then
  fail "${rows##*$'\n'} (pytest exit $rc)"
elif [ "$rc" -ne 0 ]; then
  fail "pytest exited with $rc"
elif [ "$rows_rc" -ne 0 ]; then
  fail "every collected scenario was SKIPPED, nothing ran (the skip reasons are in pytest.log)"
fi
