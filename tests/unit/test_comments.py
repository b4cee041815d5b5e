"""Comments and docstrings say why the code is as it is, once; they keep no lab notebook. Timing figures,
before-and-after histories and measurement diaries (the planted cases below show each) belong in commit messages
and in the docs, whose tables the benchmarks produce; a comment points there ('benchmarks/launch_overhead.py
measures it'). Every comment and every string statement (docstrings, attribute docstrings) of the repository's
Python files is read; code strings (messages, help) are not."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOTS = ("harness", "engines", "reports", "benchmarks", "ci", "tests", "parity", "parity_examples", "rollout")
UNIT = r"(?:ms|s|sec|secs|seconds?|min|mins|minutes?|h|hours?)"
NUMBER = r"~?\d+(?:\.\d+)?"
RULES = {
    "timing figure": re.compile(rf"(?<![\w.]){NUMBER}(?:\s?(?:-|\.\.|–)\s?{NUMBER})?\s?{UNIT}\b(?![-/=(])"),
    "before -> after figure": re.compile(rf"\d(?:\.\d+)?\s*(?:->|→)\s*{NUMBER}\s?(?:{UNIT}|%|x)(?!\w)"),
    "measurement diary": re.compile(rf"\b(?:measured|took|reached)\b[^.;:\n]{{0,40}}?{NUMBER}|\bwas ~\d", re.I),
}


def notes(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string statement."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    found += [(node.lineno, node.value.value) for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str)]
    return found


def diary(source: str) -> list[str]:
    return [f"{line}: {rule}: {match.group(0)!r}" for line, text in notes(source)
            for rule, pattern in RULES.items() for match in pattern.finditer(text)]


FILES = sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_measurements_in_comments_or_docstrings(path: Path):
    assert diary(path.read_text()) == []


@pytest.mark.parametrize(("planted", "rule"), [
    ("x = 1  # importing it costs each rank ~2 s\n", "timing figure"),
    ('"""Ranks start in 5-10 s."""\n', "timing figure"),
    ("class A:\n    b = 1\n    \"\"\"A figure takes ~0.18 s.\"\"\"\n", "timing figure"),
    ("# per-run overhead 1.0 -> 0.1 s\n", "timing figure"),
    ("# step time 68 -> 30 %\n", "before -> after figure"),
    ("# the worst clean run measured 8.7e-3 before training\n", "measurement diary"),
    ("# it was ~a third of the step\n", None),
])
def test_the_rules_catch_a_planted_diary(planted, rule):
    found = diary(planted)
    assert (rule in found[0]) if rule else found == []


def test_what_the_code_says_is_not_a_comment():
    source = 'raise TimeoutError(f"killed after {t} s")\nHELP = "poll every 0.02 s"\n# pp 2, vpp 2 -> 5 chunks\n'
    assert diary(source) == []
