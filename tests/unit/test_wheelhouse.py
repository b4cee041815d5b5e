"""ci/wheelhouse.sh runs under the workflow's freshly set-up Python, which has pip and nothing else (no `packaging`):
run under a fresh venv (`--without-pip`, pip stood in for by a shim that records its arguments), the script must
write the requirements and ask pip for each Python and the platform PARITY_WHEELHOUSE_PLATFORM names. The planted
blocker is the import of `packaging` it once had; the nightly test downloads the whole wheelhouse for real."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.torch_free

SCRIPT = REPO / "ci" / "wheelhouse.sh"
AARCH64 = ["manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64"]
PLANTED = "import re\nimport packaging.requirements  # the blocker: not in a fresh Python\n"


def _base_python() -> str:
    """The interpreter under this venv (tomllib needs >= 3.11, as the workflow's setup-python gives)."""
    if sys.version_info < (3, 11):
        pytest.skip("ci/wheelhouse.sh needs Python >= 3.11 (tomllib)")
    return getattr(sys, "_base_executable", sys.executable)


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python3"
    assert subprocess.run([str(python), "-c", "import packaging"], capture_output=True).returncode != 0, \
        "the fresh venv sees a `packaging`: it would not catch the blocker"
    return python


def _checkout(tmp_path: Path, script: str) -> Path:
    """The script and pyproject.toml in a tree of their own (the script cds to its parent's parent)."""
    (tmp_path / "ci").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "ci" / "wheelhouse.sh").write_text(script)
    return tmp_path / "ci" / "wheelhouse.sh"


def _run(tmp_path: Path, python: Path, script: str, platform: str | None) -> tuple[subprocess.CompletedProcess,
                                                                                  list[list[str]]]:
    """Run the script with `python3` = the fresh venv's, its `python3 -m pip ...` recorded instead of run."""
    shim, log = tmp_path / "shim", tmp_path / "pip.log"
    shim.mkdir()
    (shim / "python3").write_text(f'#!/usr/bin/env bash\nif [ "$1" = -m ] && [ "$2" = pip ]; then\n'
                                  f'  shift 2; echo "$*" >>"{log}"; exit 0\nfi\nexec "{python}" "$@"\n')
    (shim / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PARITY_WHEELHOUSE_PLATFORM", None)
    if platform is not None:
        env["PARITY_WHEELHOUSE_PLATFORM"] = platform
    done = subprocess.run(["bash", str(_checkout(tmp_path / "tree", script)), str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=60)
    calls = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def _dependencies() -> list[str]:
    import tomllib  # 3.11+: _base_python skips before this on 3.10

    with open(REPO / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["dependencies"]


@pytest.mark.parametrize(("platform", "tags"), [(None, AARCH64), ("aarch64", AARCH64), ("host", [])])
def test_the_wheelhouse_script_needs_only_the_standard_library(tmp_path, fresh_python, platform, tags):
    done, calls = _run(tmp_path, fresh_python, SCRIPT.read_text(), platform)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "out" / "requirements.txt").read_text().splitlines()
    assert written == [d for d in _dependencies() if not re.match(r"torch\b", d)]
    assert any(line.startswith("pyyaml") for line in written) and not any("torch>" in line for line in written)
    downloads = [c for c in calls if c[0] == "download"]
    assert [c[c.index("--python-version") + 1] for c in downloads] == ["3.11", "3.12"]
    for call in downloads:
        assert [call[i + 1] for i, arg in enumerate(call) if arg == "--platform"] == tags
        assert call[call.index("-r") + 1] == str(tmp_path / "out" / "requirements.txt")
    assert calls[0][:1] == ["wheel"]


def test_a_script_importing_packaging_fails_under_a_fresh_python(tmp_path, fresh_python):
    """The planted blocker: the requirement parser of `packaging`, which a fresh CPython lacks."""
    script = SCRIPT.read_text()
    assert "import re\n" in script
    done, _ = _run(tmp_path, fresh_python, script.replace("import re\n", PLANTED, 1), None)
    assert done.returncode != 0
    assert "No module named 'packaging'" in done.stderr


@pytest.mark.parametrize("platform", ["x86_64", ""])
def test_an_unknown_platform_is_refused_naming_the_variable(tmp_path, fresh_python, platform):
    done, calls = _run(tmp_path, fresh_python, SCRIPT.read_text(), platform)
    if platform == "":  # empty reads as unset: the default platform
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 2 and not calls
    assert f"PARITY_WHEELHOUSE_PLATFORM='{platform}' is not aarch64 or host" in done.stderr


@pytest.mark.nightly
def test_the_host_wheelhouse_installs_every_requirement_without_an_index(tmp_path):
    """The real download (PyPI) for this machine's platform, then both Pythons resolve from it with --no-index."""
    venv = tmp_path / "venv"
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True, timeout=300)  # pip, nothing else
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PARITY_WHEELHOUSE_PLATFORM": "host"}
    out = tmp_path / "wheelhouse"
    done = subprocess.run(["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert list(out.glob("parity_harness-*.whl"))
    for python in ("3.11", "3.12"):
        again = subprocess.run([str(venv / "bin" / "python3"), "-m", "pip", "download", "--no-index", "--find-links",
                                str(out), "--dest", str(tmp_path / f"check{python}"), "--only-binary=:all:",
                                "--implementation", "cp", "--python-version", python, "-r",
                                str(out / "requirements.txt")], capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
