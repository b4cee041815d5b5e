#!/usr/bin/env bash
# A venv of the stack a verl Ascend image carries, minus the device: its Python, its torch, the megatron-core of its
# Megatron-LM branch and its transformers, plus this harness — so the emulated lane can run on the mix the device
# lanes import (docs/ascend.md, "The image's stack, rehearsed"). The versions are the ones ci/check_ascend_stack.py
# reads out of verl's Dockerfile (one source of truth): it stops here when the image is refused (exit 1) or its
# stack cannot be read (exit 2 / 3).
#
#   ci/image_stack.sh VENV [VARIABLE]        # VARIABLE: a default image of the nightly's `pick` step (CURRENT_910B)
#
# Environment:
#   PARITY_VERL_SRC         a checkout of verl-project/verl (required: the Dockerfiles)
#   PARITY_VLLM_ASCEND_GIT  a clone of vllm-project/vllm-ascend: the aarch64 torch is its requirements.txt's pin
#                           (without it the x86_64 pin of the Dockerfile is used)
#   PARITY_TORCH_INDEX_URL  where torch comes from; https://download.pytorch.org/whl/cpu gives the image's own x86_64
#                           build (torch==X+cpu); unset, PyPI's — for cp312 the CUDA build with its nvidia-* wheels
#   PARITY_IMAGE_PYTHON     the interpreter (default: pythonX.Y on PATH, else pyenv's X.Y.*)
#
# transformers: a Dockerfile that installs a git commit gets the PyPI release of the version ci/ascend_stacks.yaml
# gives that commit (5.3.0.dev0 -> 5.3.0): only a package index is reachable from CI, and the report says so.
# This repository's constraints (ci/constraints-cpu.txt) hold, except for the packages the image decides.
# Exit: 0 built; 2 bad usage; else the failing step's status.
set -euo pipefail
if [ "$#" -lt 1 ] || [ "$#" -gt 2 ] || [ -z "$1" ]; then
  echo "usage: ci/image_stack.sh VENV [VARIABLE]" >&2
  exit 2
fi
venv=$1
variable=${2:-CURRENT_910B}
verl=${PARITY_VERL_SRC:?PARITY_VERL_SRC must name a checkout of verl-project/verl}
cd "$(dirname "$0")/.."

repo=()
arch=x86_64
if [ -n "${PARITY_VLLM_ASCEND_GIT:-}" ]; then
  repo=(--repo "vllm-ascend=$PARITY_VLLM_ASCEND_GIT")
  arch=aarch64 # the runners' torch
fi
stack=$(python3 ci/check_ascend_stack.py "$verl" "${repo[@]}" --image "$variable" --arch "$arch")
eval "$stack" # IMAGE DOCKERFILE ARCH PYTHON TORCH MINDSPEED MEGATRON_CORE TRANSFORMERS [TRANSFORMERS_COMMIT...]

python=${PARITY_IMAGE_PYTHON:-}
if [ -z "$python" ]; then
  # the first that runs and is X.Y (a pyenv shim exists for versions it cannot run)
  for candidate in "$(command -v "python$PYTHON" || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$PYTHON".*/bin/python; do
    if [ -x "$candidate" ] && [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$PYTHON" ]; then
      python=$candidate
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "ci/image_stack.sh: no Python $PYTHON (the image's, $DOCKERFILE): set PARITY_IMAGE_PYTHON" >&2
  exit 2
fi

started=$(date +%s)
"$python" -m venv --clear "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
pip install --progress-bar off --quiet uv==0.13.9
torch_source=()
if [ -n "${PARITY_TORCH_INDEX_URL:-}" ]; then torch_source=(--index-url "$PARITY_TORCH_INDEX_URL"); fi
uv pip install --python "$venv/bin/python" "torch==$TORCH" "${torch_source[@]}"
torch_done=$(date +%s)

# this repository's pins, less what the image decides (torch, transformers and what it pins, megatron-core)
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
grep -Eiv '^(-c |torch==|transformers==|tokenizers==|huggingface[-_]hub==|megatron[-_]core==)' \
  ci/constraints-cpu.txt >"$constraints"
megatron_line=${MEGATRON_CORE%.*}
uv pip install --python "$venv/bin/python" -c "$constraints" -e ".[dev]" "torch==$TORCH" \
  "megatron-core==$megatron_line.*" "transformers==$TRANSFORMERS" \
  "triton" einops scipy # what MindSpeed imports at load (the emulated lane); triton: the one torch pins
ended=$(date +%s)

python - "$IMAGE" "$DOCKERFILE" "$ARCH" "${TRANSFORMERS_COMMIT:-}" "${TRANSFORMERS_COMMIT_VERSION:-}" <<'PY'
import importlib.metadata as md
import sys

image, dockerfile, arch, commit, commit_version = sys.argv[1:]
have = {d: md.version(d) for d in ("torch", "megatron-core", "transformers", "triton", "parity-harness")}
print(f"{sys.prefix}: Python {sys.version.split()[0]}, " + ", ".join(f"{d} {v}" for d, v in have.items()))
print(f"  the stack of {image} ({dockerfile}, {arch})")
if commit:
    print(f"  transformers: the image installs commit {commit} ({commit_version}); this venv has the PyPI release "
          f"{have['transformers']} instead")
PY
echo "image stack: torch in $((torch_done - started)) s, the rest in $((ended - torch_done)) s;" \
  "venv $(du -sh "$venv" | cut -f1)"
