"""Torch-free identification of the installed MindSpeed and the pairing gate (runs in every lane, no MindSpeed
needed: fake source trees are written to tmp_path). Also the argv isolation MindSpeed's parser needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from parity.engines import mindspeed_env
from parity.engines.mindspeed_megatron import clean_argv
from parity.engines.specs import MINDSPEED_MEGATRON
from parity.harness.config.registry import check_environment


def _tree(root: Path, version: str, fsdp: bool = False) -> Path:
    (root / "mindspeed").mkdir(parents=True)
    (root / "mindspeed" / "__init__.py").write_text("")
    (root / "setup.py").write_text(f"import sys\n\n__version__ = '{version}'\n")
    if fsdp:
        (root / "mindspeed" / "fsdp").mkdir()
    return root


@pytest.mark.parametrize(("mindspeed", "mcore", "bad"), [
    ("0.16.0", "0.16.1", False), ("0.12.1", "0.12.1", False),
    ("0.16.0", "0.12.1", True),   # core_r0.16.0 on verl's megatron-core
    ("0.12.1", "0.16.1", True),   # 2.3.0_core_r0.12.1 / master on megatron-core 0.16
    (None, "0.16.1", False), ("2.3.0", None, False)])
def test_pairing_problem(mindspeed: str | None, mcore: str | None, bad: bool) -> None:
    problem = mindspeed_env.pairing_problem(mindspeed, mcore)
    assert (problem is not None) == bad
    if bad:
        assert f"version {mindspeed}" in problem and f"megatron-core {mcore} is installed" in problem


def test_find_mindspeed_reads_the_trees_setup_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path / "core_r0.16.0", "0.16.0")
    monkeypatch.syspath_prepend(str(root))
    found = mindspeed_env.find_mindspeed()
    assert found is not None
    assert (found.root, found.version, found.commit, found.has_fsdp) == (str(root), "0.16.0", None, False)


def test_a_bad_pairing_skips_mindspeed_megatron_naming_both_versions(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(_tree(tmp_path / "master", "0.12.1", fsdp=True)))
    monkeypatch.setattr(mindspeed_env, "megatron_core_version", lambda: "0.16.1")
    monkeypatch.setattr(type(MINDSPEED_MEGATRON), "missing", lambda self: [])  # requirements met, as in the lane
    problem = check_environment(MINDSPEED_MEGATRON)
    assert problem is not None and "0.12.1" in problem and "0.16.1" in problem
    monkeypatch.setattr(mindspeed_env, "megatron_core_version", lambda: "0.12.1")
    assert check_environment(MINDSPEED_MEGATRON) is None


def test_clean_argv_hides_the_launchers_flags_from_mindspeeds_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["pytest", "-m", "nightly", "-k", "tp2 and not sp"])
    with clean_argv():
        assert sys.argv == ["pytest"]
    assert sys.argv == ["pytest", "-m", "nightly", "-k", "tp2 and not sp"]
