"""Every verl function the harness stands in for or bridges is at a fingerprint the harness was written against,
in the installed verl and in PARITY_VERL_SRC's tree; a changed function FAILs naming it (engines/verl/upstream.py)."""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

import pytest

from parity.engines.verl import source, upstream


def _installed_root() -> Path:
    root = source.package_dir()
    if root is None:
        pytest.skip("verl is not installed (the verl lane: ci/constraints-verl.txt)")
    return root.parent


def test_every_stand_in_matches_the_installed_verl():
    assert upstream.stale(_installed_root()) == []


def test_every_stand_in_matches_parity_verl_src():
    tree = os.environ.get(source.SRC_VAR)
    if not tree:
        pytest.skip(f"{source.SRC_VAR} is not set (the nightly's verl job sets it to verl's main branch)")
    assert upstream.stale(Path(tree)) == []


def _copy(root: Path, stand_in: upstream.StandIn, into: Path) -> Path:
    target = into / stand_in.path
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / stand_in.path, target)
    return target


def _function(text: str, qualname: str) -> ast.AST:
    node: ast.AST = ast.parse(text)
    for part in qualname.split("."):
        node = next(n for n in node.body if getattr(n, "name", None) == part)  # type: ignore[attr-defined]
    return node


@pytest.mark.parametrize("stand_in", upstream.STAND_INS, ids=lambda s: s.name)
def test_a_changed_function_fails_naming_it_and_a_reformatted_one_passes(stand_in, tmp_path):
    root = _installed_root()
    file = _copy(root, stand_in, tmp_path)
    text = file.read_text()
    lines = text.splitlines(keepends=True)
    first = _function(text, stand_in.qualname).body[0]  # type: ignore[attr-defined]
    indent = " " * first.col_offset
    at = first.lineno - 1
    # clean twin: a comment and a blank line inside the function change nothing that runs
    file.write_text("".join([*lines[:at], f"{indent}# reformatted\n", "\n", *lines[at:]]))
    assert upstream.stale(tmp_path, (stand_in,)) == []
    # planted: one statement added to the function, as an upstream edit would
    file.write_text("".join([*lines[:at], f"{indent}_parity_planted = 1\n", *lines[at:]]))
    problems = upstream.stale(tmp_path, (stand_in,))
    assert len(problems) == 1 and stand_in.name in problems[0] and "changed" in problems[0]
    file.unlink()
    assert "is gone" in upstream.stale(tmp_path, (stand_in,))[0]
