"""Torch-free identification of the installed MindSpeed and the pairing gate (runs in every lane, no MindSpeed
needed: fake source trees are written to tmp_path, with the README / setup.py facts of MindSpeed's real branches
from tests/data/mindspeed_branches). Also the argv isolation MindSpeed's parser needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from parity.engines.mindspeed import env as mindspeed_env
from parity.engines.mindspeed.megatron import clean_argv
from parity.engines.specs import MINDSPEED_MEGATRON
from parity.harness.config.registry import check_environment
from tests.conftest import DATA

BRANCHES = DATA / "mindspeed_branches"


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
        assert f"pairs with megatron-core {mindspeed}" in problem and f"megatron-core {mcore} is installed" in problem


def test_find_mindspeed_reads_the_trees_setup_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path / "core_r0.16.0", "0.16.0")
    monkeypatch.syspath_prepend(str(root))
    found = mindspeed_env.find_mindspeed()
    assert found is not None
    assert (found.root, found.version, found.commit, found.has_fsdp) == (str(root), "0.16.0", None, False)
    assert (found.pairs_with, found.pairing_declared_by) == ("0.16.0", "setup.py __version__ (the README names no "
                                                                       "Megatron release)")


#: branch -> (the megatron-core release its README declares, how, setup.py's version)
DECLARED = {
    "2.1.0_core_r0.12.1": ("0.12.1", "git checkout core_v0.12.1", "0.12.1"),
    "2.2.0_core_r0.12.1": ("0.12.1", "git checkout core_v0.12.1", "0.12.1"),
    "2.3.0_core_r0.12.1": ("0.12.1", "git checkout core_v0.12.1", "0.12.1"),
    "26.0.0_core_r0.12.1": ("0.12.1", "git checkout core_v0.12.1", "0.12.1"),
    "26.1.0_core_r0.12.1": ("0.12.1", "git checkout core_v0.12.1", "0.12.1"),
    # a Megatron-LM commit of no release: no megatron-core release is known to pair with it
    "dev": ("1d462bd37", "git checkout 1d462bd37", "0.14.1"),
    "master": ("0.12.1", "git checkout core_v0.12.1", "0.12.1"),
    # its version table is master's (Mcore 0.12.1); its install steps check out core_r0.14.0
    "core_r0.14.0": ("0.14.0", "git checkout core_r0.14.0", "0.14.1"),
    "core_r0.15.3": ("0.15.3", "git checkout v0.15.3", "0.15.3"),
    "core_r0.16.0": ("0.16.0", "git checkout core_r0.16.0", "0.16.0"),
    # setup.py still says 0.12.1: the check that read it accepted these trees on megatron-core 0.12
    "core_r0.17.0": ("0.17.1", "git checkout core_r0.17.1", "0.12.1"),
    "core_r0.18.0": ("0.17.1", "git checkout core_r0.17.1", "0.12.1"),
}


def _branch_tree(root: Path, branch: str) -> Path:
    (root / "mindspeed").mkdir(parents=True)
    (root / "mindspeed" / "__init__.py").write_text("")
    for name in ("README.md", "setup.py"):
        (root / name).write_text((BRANCHES / branch / name).read_text())
    if (BRANCHES / branch / "fsdp").read_text().startswith("mindspeed/fsdp present"):
        (root / "mindspeed" / "fsdp").mkdir()
    return root


#: the branches that ship MindSpeed's FSDP engine (`mindspeed/fsdp`), as `git ls-tree` found them
HAS_FSDP = {"26.0.0_core_r0.12.1", "26.1.0_core_r0.12.1", "master"}


@pytest.mark.parametrize("branch", sorted(DECLARED))
def test_each_branch_pairs_with_what_its_readme_declares(branch: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert sorted(p.name for p in BRANCHES.iterdir()) == sorted(DECLARED)  # every copied branch is checked
    monkeypatch.syspath_prepend(str(_branch_tree(tmp_path / branch, branch)))
    found = mindspeed_env.find_mindspeed()
    pairs_with, how, setup_version = DECLARED[branch]
    assert found is not None and (found.pairs_with, found.version) == (pairs_with, setup_version)
    assert how in found.pairing_declared_by
    assert (found.megatron_adaptor is not None) == branch.startswith(("core_r0.17", "core_r0.18"))
    assert found.has_fsdp == (branch in HAS_FSDP)


def test_core_r017_on_megatron_core_012_is_refused_where_setup_py_would_accept_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(_branch_tree(tmp_path / "ms", "core_r0.17.0")))
    monkeypatch.setattr(type(MINDSPEED_MEGATRON), "missing", lambda self: [])
    assert mindspeed_env.pairing_problem("0.12.1", "0.12.1") is None  # what the setup.py check concluded
    monkeypatch.setattr(mindspeed_env, "megatron_core_version", lambda: "0.12.1")
    problem = check_environment(MINDSPEED_MEGATRON)
    assert problem is not None and "pairs with megatron-core 0.17.1 (README.md: git checkout core_r0.17.1" in problem
    monkeypatch.setattr(mindspeed_env, "megatron_core_version", lambda: "0.17.1")
    problem = check_environment(MINDSPEED_MEGATRON)  # the right pairing; MegatronAdaptor is not installed here
    assert problem is not None and "declares MegatronAdaptor core_r0.17.0" in problem
    (tmp_path / "adaptor" / "megatron_adaptor").mkdir(parents=True)
    (tmp_path / "adaptor" / "megatron_adaptor" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "adaptor"))
    assert check_environment(MINDSPEED_MEGATRON) is None


def test_install_steps_win_over_the_table_which_wins_over_setup_py() -> None:
    readme = (BRANCHES / "core_r0.14.0" / "README.md").read_text()
    assert mindspeed_env.declared_pairing(readme, "0.14.1").megatron == "0.14.0"
    without_steps = "\n".join(line for line in readme.splitlines() if "git checkout" not in line)
    table = mindspeed_env.declared_pairing(without_steps, "0.14.1")
    assert (table.megatron, table.declared_by) == ("0.12.1", "README.md version table (Mcore版本 0.12.1)")
    assert mindspeed_env.declared_pairing(None, "0.14.1").declared_by.startswith("setup.py")
    assert mindspeed_env.declared_pairing(None, None) is None


def test_an_installed_distribution_is_read_from_its_recorded_description(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-editable install has no README.md next to the package: MindSpeed's setup.py puts it in the
    long description, which pip records in METADATA."""
    site = tmp_path / "site"
    (site / "mindspeed").mkdir(parents=True)
    (site / "mindspeed" / "__init__.py").write_text("")
    info = site / "mindspeed-0.12.1.dist-info"
    info.mkdir()
    readme = (BRANCHES / "core_r0.17.0" / "README.md").read_text()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mindspeed\nVersion: 0.12.1\n\n{readme}")
    monkeypatch.syspath_prepend(str(site))
    found = mindspeed_env.find_mindspeed()
    assert found is not None and (found.version, found.pairs_with) == ("0.12.1", "0.17.1")


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
