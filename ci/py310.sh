#!/usr/bin/env bash
# The Python 3.10 lane: the torch-free tests (`pytest -m torch_free tests/unit`: schema, validation, the CLI,
# reports, history) on Python 3.10, in a fresh venv at $1 without torch (pyproject.toml says requires-python >= 3.10;
# torch's pinned build has no 3.10 wheel here, and the torch-free parts are what a 3.10 user's CLI runs first).
# Pins: ci/constraints-py310.txt. Python 3.10 comes from $PARITY_PYTHON310, python3.10 on PATH, pyenv's versions,
# or uv (which downloads one where it may). Run by .ci/run; alone: bash ci/py310.sh /tmp/venv-py310
set -euo pipefail
venv=${1:?usage: ci/py310.sh VENV_DIR}
cd "$(dirname "$0")/.."

find_python310() {
  local candidate pyenv_root
  pyenv_root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  for candidate in "${PARITY_PYTHON310:-}" "$(command -v python3.10 || true)" "$pyenv_root"/versions/3.10*/bin/python3.10; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  uv python find 3.10 2>/dev/null || { uv python install 3.10 >&2 && uv python find 3.10; }
}

python=$(find_python310) || {
  echo "ci/py310.sh: no Python 3.10 here: set PARITY_PYTHON310, install python3.10 (apt, pyenv) or let uv download one" >&2
  exit 1
}
# what the torch-free code imports: the project's dependencies but the torch stack, and the GFM parser the
# markdown tests read summary.md with
requirements=$(python3 - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
names = [re.split(r"[<>=!~ \[]", dep, maxsplit=1)[0] for dep in project["dependencies"]]
print(" ".join([n for n in names if n not in ("torch", "transformers", "safetensors")] + ["markdown-it-py"]))
PY
)
uv venv --quiet --python "$python" "$venv"
# shellcheck disable=SC2086
uv pip install --quiet --python "$venv/bin/python" $requirements -c ci/constraints-py310.txt
uv pip install --quiet --python "$venv/bin/python" --no-deps -e .
"$venv/bin/python" -c 'import sys; print("Python", sys.version.split()[0], "in", sys.prefix)'
"$venv/bin/python" -m pytest -p no:cacheprovider -q -m torch_free tests/unit
