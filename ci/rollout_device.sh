#!/usr/bin/env bash
# The rollout rows of a device lane (docs/rollout.md): vLLM-Ascend on npu, vLLM on cuda, against the trainers of
# FILE, in the environment the job already has (the Ascend image's packages through ci/nightly.sh's venv, the CUDA
# runner's python): vLLM and the trainers share it there, so one python serves as both trainer lanes.
#
#   ci/rollout_device.sh npu|cuda FILE OUT [VENV]
#
# Rows SKIP naming the package where vLLM (-Ascend) is absent; exit 1 when a row FAILs or ERRORs.
set -euo pipefail
usage="usage: ci/rollout_device.sh npu|cuda FILE OUT [VENV]"
device=${1:?$usage}
file=${2:?$usage}
out=${3:?$usage}
venv=${4:-}
cd "$(dirname "$0")/.."
if [ "$device" = npu ]; then  # CANN, as ci/nightly.sh sources it (a step's bash is no login shell)
  for env_script in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/cann/set_env.sh \
    /usr/local/Ascend/nnal/atb/set_env.sh; do
    # shellcheck disable=SC1090
    if [ -f "$env_script" ]; then set +eu; . "$env_script"; set -eu; fi
  done
fi
if [ -n "$venv" ]; then
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
fi
python=$(command -v python3)
export PARITY_TRAINER_PYTHON=$python PARITY_VERL_PYTHON=$python
# the checkout's parity/ folder must not shadow the harness installed from the wheelhouse (python -m puts the
# working directory first), in this process or in the trainers it starts
export PYTHONSAFEPATH=1
"$python" -m parity.rollout "$file" --out "$out"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$out/summary.md" ]; then cat "$out/summary.md" >>"$GITHUB_STEP_SUMMARY"; fi
