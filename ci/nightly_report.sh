#!/usr/bin/env bash
# Merge the nightly lanes' results (downloaded artifacts, one parity-out/LANE/ folder each) into one table:
# `parity report parity-out/* --out parity-merged --html`, which writes parity-merged/summary.md and report.html
# and appends the table (and a link to the page) to the job's step summary. Exit 0 once the merged table is
# written, also when it holds FAIL rows (the lane jobs are red for those); non-zero when there is nothing to merge
# or the report itself fails.
set -euo pipefail
cd "$(dirname "$0")/.."
summary=${GITHUB_STEP_SUMMARY:-/dev/null}
shopt -s nullglob
lanes=(parity-out/*/results.jsonl)
lanes=("${lanes[@]%/results.jsonl}")

if [ "${#lanes[@]}" -eq 0 ]; then
  echo "::error title=nightly report::no lane results to merge (did every lane fail before writing results.jsonl?)"
  echo '### Nightly parity: no lane results to merge' >>"$summary"
  exit 1
fi

# `parity report` keeps one row per scenario id: say so when two lanes ran the same scenario.
python3 - "${lanes[@]}" <<'PY'
import json
import sys
from collections import defaultdict

lanes_of = defaultdict(list)
for lane in sys.argv[1:]:
    with open(f"{lane}/results.jsonl") as handle:
        for line in filter(str.strip, handle):
            try:
                lanes_of[json.loads(line)["id"]].append(lane)
            except (ValueError, KeyError):  # a line cut off by a killed lane: `parity report` skips it too
                print(f"::warning title=nightly report::{lane}/results.jsonl holds a cut-off line; skipped")
for run_id, lanes in sorted(lanes_of.items()):
    if len(lanes) > 1:
        print(f"::warning title=nightly report::{run_id} ran in {', '.join(lanes)}; the merged table keeps the last")
PY

venv="${RUNNER_TEMP:-$(mktemp -d)}/parity-venv-report"
bash ci/install_cpu.sh "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"

printf '# Nightly parity, all lanes: %s\n\n' "${lanes[*]#parity-out/}" >>"$summary"
rc=0
parity report "${lanes[@]}" --out parity-merged --html || rc=$?
if [ "$rc" -gt 1 ] || [ ! -f parity-merged/summary.md ]; then
  echo "::error title=nightly report::parity report exited with $rc and wrote no merged summary"
  echo "parity report failed (exit $rc); see the job log." >>"$summary"
  exit 1
fi
# The page (sortable table, per-scenario plots): in the parity-merged artifact, and on GitHub Pages where enabled.
if [ -f parity-merged/report.html ]; then
  run_url="${GITHUB_SERVER_URL:-https://github.com}/${GITHUB_REPOSITORY:-}/actions/runs/${GITHUB_RUN_ID:-}"
  printf '\n**Full report** (sortable table, loss / grad-norm / |Δ log-prob| plots per scenario): `report.html` in the [parity-merged artifact](%s#artifacts)' "$run_url" >>"$summary"
  if [ -n "${PARITY_PAGES_URL:-}" ]; then
    printf ', published at [%s](%s)' "$PARITY_PAGES_URL" "$PARITY_PAGES_URL" >>"$summary"
  fi
  printf '\n' >>"$summary"
fi
echo "merged ${#lanes[@]} lane(s) into parity-merged/ (parity report exit $rc)"
