"""The test suite's own rules: tests/README.md says what each test folder holds, and no test can pass without
checking anything, i.e. a test's asserts do not all sit under an `if` or in a loop that may run zero times (a
matrix whose rows all skipped, a filter that matched nothing). A loop over a literal collection is certain to run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.torch_free

TESTS = REPO / "tests"


def _certain_loop(node: ast.For | ast.AsyncFor) -> bool:
    return isinstance(node.iter, ast.Tuple | ast.List | ast.Set | ast.Dict) and bool(
        node.iter.keys if isinstance(node.iter, ast.Dict) else node.iter.elts)


def _certain_checks(body: list[ast.stmt]) -> int:
    """Asserts (and pytest.raises blocks) every run of `body` reaches."""
    count = 0
    for stmt in body:
        if isinstance(stmt, ast.Assert):
            count += 1
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            count += any("raises" in ast.unparse(item.context_expr) for item in stmt.items)
            count += _certain_checks(stmt.body)
        elif isinstance(stmt, ast.Try) or (isinstance(stmt, ast.For | ast.AsyncFor) and _certain_loop(stmt)):
            count += _certain_checks(stmt.body)
    return count


def vacuous_tests(source: str) -> list[str]:
    """Test functions that assert something, but nothing that every run reaches."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
                and any(isinstance(n, ast.Assert) for n in ast.walk(node)) and not _certain_checks(node.body)):
            found.append(f"{node.lineno}: {node.name}")
    return found


@pytest.mark.parametrize("path", sorted(TESTS.rglob("test_*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_no_test_checks_only_under_a_condition(path: Path):
    assert vacuous_tests(path.read_text()) == []


@pytest.mark.parametrize(("source", "vacuous"), [
    ("def test_a():\n    if x:\n        assert y\n", True),
    ("def test_a(rows):\n    for row in rows:\n        assert row.ok\n", True),
    ("def test_a(rows):\n    for row in rows:\n        if row.ran:\n            assert row.ok\n", True),
    ("def test_a(rows):\n    assert rows\n    for row in rows:\n        assert row.ok\n", False),
    ("def test_a():\n    for d in (0, 1):\n        assert f(d)\n", False),
    ("def test_a():\n    with pytest.raises(ValueError):\n        f()\n    if x:\n        assert y\n", False),
    ("def test_a():\n    f()\n", False),  # no assert at all: its checks are elsewhere (a helper, pytester)
])
def test_the_rule_on_planted_tests(source, vacuous):
    assert bool(vacuous_tests(source)) is vacuous


def test_every_test_folder_is_described():
    described = (TESTS / "README.md").read_text()
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert folders and [name for name in folders if f"`{name}/`" not in described] == []
