"""The map cannot drift from the territory: every repository path the docs cite exists; docs/architecture.md's
layer table is the import-layer test's, its engine-family table is engines/ and the built-in specs; docs/engines.md
names every built-in engine. Each comparison is also run on a planted drift it must catch. Torch-free."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from parity.engines.specs import BUILTIN
from tests.conftest import REPO
from tests.unit.test_docs import section, table_rows, ticked
from tests.unit.test_import_layers import LAYERS

pytestmark = pytest.mark.torch_free

ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text()
#: the documents a reader follows: the README, CONTRIBUTING and every page under docs/ and tests/
DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md")),
        REPO / "tests" / "README.md"]
#: where a cited path of this repository starts
ROOTS = ("harness/", "engines/", "reports/", "tests/", "scenarios/", "ci/", "benchmarks/", "docs/", "parity/",
         "parity_examples/", ".ci/", ".github/", "README.md", "CONTRIBUTING.md", "pyproject.toml", "tox.ini")
CITATION = re.compile(r"`([^`\s]+)`|\]\(([^)\s#]+)")


def cited_paths(doc: Path, text: str) -> set[str]:
    """Repository paths a document cites: in backticks (a `file.py:function` suffix dropped) or as relative links;
    patterns (`*`, `$VAR`, `<name>`, `{...}`) are not paths."""
    found = set()
    for match in CITATION.finditer(text):
        raw = match.group(1) or match.group(2)
        if raw.startswith(("http:", "https:", "mailto:")):
            continue
        path = raw.split(":")[0].rstrip(".,;)")
        if match.group(2):
            resolved = (doc.parent / path).resolve()
            if not resolved.is_relative_to(REPO):
                continue
            path = str(resolved.relative_to(REPO))
        if path.startswith(ROOTS) and not any(mark in path for mark in "*${}<>"):
            found.add(path)
    return found


def missing(doc: Path, text: str) -> list[str]:
    return [path for path in sorted(cited_paths(doc, text)) if not (REPO / path).exists()]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_the_docs_cite_exists(doc):
    assert missing(doc, doc.read_text()) == []


def test_a_cited_path_that_is_gone_is_found():
    doc = REPO / "docs" / "engines.md"
    text = "the table in `harness/names.py` and [the rule](../engines/fsdp2.py), not `engines/specs.py:BUILTIN`"
    assert missing(doc, text) == ["engines/fsdp2.py", "harness/names.py"]


# ---- the layer table ---------------------------------------------------------------------------------------------

def documented_layers(text: str) -> list[tuple[str, int]]:
    return [(ticked(row[1])[0], int(row[0])) for row in table_rows(section(text, "Layers"))]


def test_the_layer_table_is_the_import_layer_tests():
    assert sorted(documented_layers(ARCHITECTURE)) == sorted(LAYERS)


def test_a_layer_moved_in_the_docs_only_is_found():
    planted = ARCHITECTURE.replace("| 4 | `parity.harness.judge`", "| 3 | `parity.harness.judge`")
    assert sorted(documented_layers(planted)) != sorted(LAYERS)


# ---- the engine families -----------------------------------------------------------------------------------------

def documented_families(text: str) -> dict[str, set[str]]:
    """package folder -> the strategy names the table lists for it."""
    return {ticked(row[1])[0].rstrip("/"): set(ticked(row[2])) for row in table_rows(section(text, "Engine families"))}


def code_families() -> dict[str, set[str]]:
    """engines/<package> -> the built-in engines whose class lives in it."""
    families: dict[str, set[str]] = {}
    for spec in BUILTIN:
        package = spec.engine.partition(":")[0].split(".")[2]
        families.setdefault(f"engines/{package}", set()).add(spec.name)
    return families


def test_the_family_table_is_engines_packages_and_the_builtin_specs():
    assert documented_families(ARCHITECTURE) == code_families()
    assert all((REPO / package / "__init__.py").is_file() for package in code_families())


def test_an_engine_left_out_of_the_family_table_is_found():
    planted = ARCHITECTURE.replace(", `verl_mindspeed`", "")
    assert documented_families(planted) != code_families()


def test_engines_md_names_every_builtin_engine():
    rows = table_rows(section((REPO / "docs" / "engines.md").read_text(), "Built-in engines"))
    assert sorted(ticked(row[0])[0] for row in rows) == sorted(spec.name for spec in BUILTIN)
