#!/usr/bin/env bash
# Create a fresh venv at $1 and install the CPU test stack into it: the same pins as the README's commands
#   pip install torch==2.13.0 && pip install -e ".[dev,megatron]" -c ci/constraints-cpu.txt
# with uv doing the second step (CI only; see below).
# $2 and on (optional): another constraints file and what to install with it, for a lane's own stack, e.g.
#   ci/install_cpu.sh DIR ci/constraints-megatron012.txt -e . megatron-core     (megatron-core 0.12.1)
# PARITY_TORCH_INDEX_URL (optional): where to take torch from. GitHub-hosted runners set it to
# https://download.pytorch.org/whl/cpu, because plain PyPI would give the multi-GB CUDA build; unset, pip uses its
# own configuration (on the project's CI machines the CPU wheel lies on local disk).
set -euo pipefail
venv=${1:?usage: ci/install_cpu.sh VENV_DIR [CONSTRAINTS REQUIREMENT...]}
constraints=${2:-ci/constraints-cpu.txt}
targets=("${@:3}")
if [ ${#targets[@]} -eq 0 ]; then targets=(-e ".[dev,megatron]"); fi
cd "$(dirname "$0")/.."

python3 -m venv --clear "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
torch_source=()
if [ -n "${PARITY_TORCH_INDEX_URL:-}" ]; then
  torch_source=(--index-url "$PARITY_TORCH_INDEX_URL")
fi
# Byte-compiling every installed file is ~45 of the ~90 s here (2 cores), and most of torch / transformers /
# megatron is never imported: skip it when imports may write .pyc (they then compile what they use, once: ~15 s).
# With PYTHONDONTWRITEBYTECODE set (these machines export it; .ci/run unsets it) nothing would ever be cached, so
# every process would compile from source again: compile at install then.
compile=()
uv_compile=()
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then compile=(--no-compile); else uv_compile=(--compile-bytecode); fi
# torch with pip: pip's configuration is what finds the local CPU wheel (uv reads no pip.conf)
pip install --progress-bar off "${compile[@]}" torch==2.13.0 "${torch_source[@]}"
# the rest with uv, pinned like everything else: pip spent ~30 s of CPU resolving and unpacking the ~70 pinned
# packages on 2 cores, uv ~4 s. torch is already there and satisfies the constraints' torch==2.13.0, so uv
# leaves it alone.
pip install --progress-bar off "${compile[@]}" uv==0.13.9
uv pip install --python "$venv/bin/python" "${uv_compile[@]}" "${targets[@]}" -c "$constraints"
python -c 'import sys, torch; print("torch", torch.__version__, "installed in", sys.prefix)'
