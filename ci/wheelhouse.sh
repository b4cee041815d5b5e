#!/usr/bin/env bash
# Build the wheelhouse the Ascend lanes install from without a package index (ci/nightly.sh npu): the harness's own
# wheel and every runtime dependency except torch (the image's build, which torch_npu is compiled against), as
# wheels for the Ascend runners' platform (linux aarch64) and the Pythons of verl's images (CPython 3.11 and 3.12).
# Run on the GitHub-hosted CPU job; the workflow uploads DIR as the parity-wheelhouse artifact.
#
#   ci/wheelhouse.sh DIR
set -euo pipefail
out=${1:?usage: ci/wheelhouse.sh DIR}
cd "$(dirname "$0")/.."
mkdir -p "$out"
python3 -m pip wheel --progress-bar off --no-deps --wheel-dir "$out" .
# the [project] dependencies, torch left out (pyproject.toml is the one list)
python3 - >"$out/requirements.txt" <<'PY'
import tomllib
from packaging.requirements import Requirement

with open("pyproject.toml", "rb") as handle:
    for text in tomllib.load(handle)["project"]["dependencies"]:
        if Requirement(text).name != "torch":
            print(text)
PY
for python in 3.11 3.12; do
  python3 -m pip download --progress-bar off --dest "$out" --only-binary=:all: --implementation cp \
    --python-version "$python" --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
    --platform manylinux_2_28_aarch64 -r "$out/requirements.txt"
done
ls "$out" | wc -l
