#!/usr/bin/env bash
# Build the wheelhouse the Ascend lanes install from without a package index (ci/nightly.sh npu): the harness's own
# wheel and every runtime dependency except torch (the image's build, which torch_npu is compiled against), as
# wheels for the target platform and the Pythons of verl's images (CPython 3.11 and 3.12).
# Run on the GitHub-hosted CPU job; the workflow uploads DIR as the parity-wheelhouse artifact.
#
#   ci/wheelhouse.sh DIR
#
# Environment: PARITY_WHEELHOUSE_PLATFORM  aarch64 (default): the Ascend runners' linux aarch64 (manylinux tags);
#                                          host: the platform of the machine running this script (a CPU rehearsal
#                                          of the nightly on x86_64 installs from it)
# Needs python3 >= 3.11 with pip and nothing else: the workflow's freshly set-up Python has no `packaging`.
# Exit 2: bad usage or an unknown platform.
set -euo pipefail
pythons=(3.11 3.12)
usage="usage: ci/wheelhouse.sh DIR"
if [ "$#" -ne 1 ] || [ -z "$1" ]; then
  echo "$usage" >&2
  exit 2
fi
out=$1
case "${PARITY_WHEELHOUSE_PLATFORM:-aarch64}" in
  aarch64) platforms=(--platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64
    --platform manylinux_2_28_aarch64) ;;
  host) platforms=() ;; # pip's own tags for this machine, at each --python-version
  *)
    echo "ci/wheelhouse.sh: PARITY_WHEELHOUSE_PLATFORM='$PARITY_WHEELHOUSE_PLATFORM' is not aarch64 or host" >&2
    exit 2
    ;;
esac
mkdir -p "$out"
out=$(cd "$out" && pwd) # the wheels land in DIR as the caller named it, whatever the cd below
cd "$(dirname "$0")/.."
python3 -m pip wheel --progress-bar off --no-deps --wheel-dir "$out" .
# the [project] dependencies, torch left out (pyproject.toml is the one list); the standard library only: a PEP 508
# name is the requirement's leading [A-Za-z0-9._-] run, compared as PEP 503 normalises names
python3 - >"$out/requirements.txt" <<'PY'
import re
import tomllib

NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")

with open("pyproject.toml", "rb") as handle:
    for text in tomllib.load(handle)["project"]["dependencies"]:
        name = NAME.match(text)
        if name is None:
            raise SystemExit(f"pyproject.toml: [project] dependencies: {text!r} does not start with a PEP 508 name")
        if re.sub(r"[-_.]+", "-", name.group(1)).lower() != "torch":
            print(text)
PY
for python in "${pythons[@]}"; do
  python3 -m pip download --progress-bar off --dest "$out" --only-binary=:all: --implementation cp \
    --python-version "$python" "${platforms[@]}" -r "$out/requirements.txt"
done
ls "$out" | wc -l
