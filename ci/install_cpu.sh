#!/usr/bin/env bash
# Create a fresh venv at $1 and install the CPU test stack into it: the same pins as the README's commands
#   pip install -r ci/torch.txt && pip install -e ".[dev,megatron]" -c ci/constraints-cpu.txt
# with uv doing both steps (CI only; see below).
# $2 and on (optional): another constraints file and what to install with it, for a lane's own stack, e.g.
#   ci/install_cpu.sh DIR ci/constraints-megatron012.txt -e . megatron-core     (megatron-core 0.12.1)
# PARITY_TORCH_INDEX_URL (optional): where to take torch from. GitHub-hosted runners set it to
# https://download.pytorch.org/whl/cpu, because plain PyPI would give the multi-GB CUDA build; unset, torch comes
# from pip's configured find-links (on the project's CI machines the CPU wheel lies on local disk) or PyPI.
set -euo pipefail
venv=${1:?usage: ci/install_cpu.sh VENV_DIR [CONSTRAINTS REQUIREMENT...]}
constraints=${2:-ci/constraints-cpu.txt}
targets=("${@:3}")
if [ ${#targets[@]} -eq 0 ]; then targets=(-e ".[dev,megatron]"); fi
cd "$(dirname "$0")/.."

python3 -m venv --clear "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
# Byte-compiling every installed file is about half of this install, and most of torch / transformers / megatron
# is never imported: skip it when imports may write .pyc (they then compile what they use, once).
# With PYTHONDONTWRITEBYTECODE set (these machines export it; .ci/run unsets it) nothing would ever be cached, so
# every process would compile from source again: compile at install then.
compile=()
uv_compile=()
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then compile=(--no-compile); else uv_compile=(--compile-bytecode); fi
pip install --progress-bar off "${compile[@]}" uv==0.13.9
# Everything with uv, several times faster than pip at resolving and unpacking the pinned packages and torch's
# wheel on 2 cores. torch first, from where pip would take it: uv reads no pip
# configuration, so it gets pip's find-links (where these machines keep the CPU wheel) or PARITY_TORCH_INDEX_URL.
torch_source=()
if [ -n "${PARITY_TORCH_INDEX_URL:-}" ]; then
  torch_source=(--index-url "$PARITY_TORCH_INDEX_URL")
else
  for links in $(pip config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}; do
    torch_source+=(--find-links "$links")
  done
fi
uv pip install --python "$venv/bin/python" "${uv_compile[@]}" -r ci/torch.txt "${torch_source[@]}"
# then the rest, pinned like everything else; the torch just installed satisfies the constraints' pin (the same
# file; 2.13.0+cpu: PEP 440 ignores the local label), so uv leaves it alone
uv pip install --python "$venv/bin/python" "${uv_compile[@]}" "${targets[@]}" -c "$constraints"
# what this lane tests, by version (the verl lane's transformers differs from the default lane's)
python -c 'import importlib.metadata as m, sys
have = [f"{d} {m.version(d)}" for d in ("torch", "transformers", "megatron-core", "verl")
        if d in {x.metadata["Name"] for x in m.distributions()}]
print(", ".join(have), "installed in", sys.prefix)'
