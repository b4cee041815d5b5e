"""The layering is enforced, not hoped for: every import in the package is read with `ast` and checked against
the layer order below. The chain YAML -> Scenario -> launch -> worker/engine -> RunRecord -> compare -> Verdict ->
reporters is a dependency order: a module imports only its own layer or LOWER ones, never one above it.

  0 contract   parity.harness.contract   what an engine implements and consumes (imports nothing else of ours)
  1 engines    parity.engines, parity.examples   (import only the contract)
  2 config     parity.harness.config     YAML, validation, the spec registry (the ONLY door to engines: specs)
  3 run        parity.harness.run        cards, launchers, the rank body, the RunRecord it writes
  4 judge      parity.harness.judge      references, comparison, tolerances, verdicts
  5 reports    parity.reports            renderers of verdict JSON
  6 drivers    parity.harness.<module>   runner, CLI, pytest plugin, plan, options
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"parity.harness": REPO / "harness", "parity.engines": REPO / "engines", "parity.reports": REPO / "reports",
         "parity.examples": REPO / "parity_examples"}
LAYERS = [("parity.harness.contract", 0), ("parity.engines", 1), ("parity.examples", 1),
          ("parity.harness.config", 2), ("parity.harness.run", 3), ("parity.harness.judge", 4),
          ("parity.reports", 5), ("parity.harness", 6)]
#: the one orchestration module that may import an engine module: the spec registry, and only the specs
ENGINE_DOOR = {"parity.harness.config.registry": {"parity.engines.specs"}}


def layer(module: str) -> int | None:
    for prefix, index in LAYERS:  # most specific prefix first
        if module == prefix or module.startswith(prefix + "."):
            return index
    return None


def modules() -> dict[str, Path]:
    found = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import, at any depth (lazy imports inside functions count too)."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                package = module.rsplit(".", node.level - (path.name == "__init__.py"))[0]
                base = f"{package}.{base}".rstrip(".")
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                    if f"{base}.{alias.name}" in MODULES]
    return out


MODULES = modules()


def violations(name: str, path: Path) -> list[str]:
    own = layer(name)
    problems = []
    for line, imported in imports_of(path, name):
        target = layer(imported)
        if target is None:
            continue
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
        where = f"{shown}:{line} imports {imported}"
        if target == 1 and own != 1:
            if imported not in ENGINE_DOOR.get(name, set()):
                problems.append(f"{where}: only the spec registry may reach engines (through parity.engines.specs)")
        elif target > own:
            problems.append(f"{where}: layer {own} imports layer {target} (upward)")
    return problems


def test_the_package_has_every_layer():
    assert {layer(name) for name in MODULES} == set(range(7)), "a layer is empty: the test would prove nothing"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_run_down_the_layers(name):
    assert violations(name, MODULES[name]) == []


def test_the_check_catches_an_upward_and_a_sideways_import(tmp_path):
    """The rule itself, on planted modules: an engine importing the runner, a verdict importing the launcher's
    caller, an orchestration module importing an engine module directly."""
    planted = {
        "parity.engines.bad": "from parity.harness.runner import Runner\n",
        "parity.harness.judge.bad": "import parity.harness.cli\n",
        "parity.harness.run.bad": "def f():\n    from parity.engines.fsdp2 import FSDP2Engine\n",
        "parity.harness.config.fine": "from parity.engines.specs import BUILTIN\n",
    }
    found = {}
    for name, source in planted.items():
        path = tmp_path / f"{name.replace('.', '_')}.py"
        path.write_text(source)
        found[name] = violations(name, path)
    assert "upward" in found["parity.engines.bad"][0]
    assert "upward" in found["parity.harness.judge.bad"][0]
    assert "only the spec registry" in found["parity.harness.run.bad"][0]
    assert "only the spec registry" in found["parity.harness.config.fine"][0]  # only registry.py holds the door
