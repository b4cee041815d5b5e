#!/usr/bin/env bash
# Create a fresh venv at $1 and install the CPU test stack into it, as the README's test command does:
#   pip install torch==2.13.0 && pip install -e ".[dev,megatron]" -c ci/constraints-cpu.txt
# PARITY_TORCH_INDEX_URL (optional): where to take torch from. GitHub-hosted runners set it to
# https://download.pytorch.org/whl/cpu, because plain PyPI would give the multi-GB CUDA build; unset, pip uses its
# own configuration (on the project's CI machines the CPU wheel lies on local disk).
set -euo pipefail
venv=${1:?usage: ci/install_cpu.sh VENV_DIR}
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
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then compile=(--no-compile); fi
pip install --progress-bar off "${compile[@]}" torch==2.13.0 "${torch_source[@]}"
pip install --progress-bar off "${compile[@]}" -e ".[dev,megatron]" -c ci/constraints-cpu.txt
python -c 'import sys, torch; print("torch", torch.__version__, "installed in", sys.prefix)'
