"""The layering is enforced, not hoped for: every import in the package, the benchmarks and the CI scripts is read
with `ast` and checked against the layer order below. The chain YAML -> Scenario -> launch -> worker/engine ->
RunRecord -> compare -> Verdict -> reporters is a dependency order: a module imports only its own layer or LOWER
ones, never one above it.

  0 contract   parity.harness.contract   what an engine implements and consumes (imports nothing else of ours)
  1 engines    parity.engines, parity.examples, parity.reference (the reference's own math)   (import only the
               contract)
  2 config     parity.harness.config     YAML, validation, the spec registry (the ONLY door to engines: specs)
  3 run        parity.harness.run        cards, launchers, the rank body, the RunRecord it writes
  4 judge      parity.harness.judge      references, comparison, tolerances, verdicts
  5 reports    parity.reports            renderers of verdict JSON
  6 drivers    parity.harness.<module>   session, runner, CLI, pytest plugin, plan, options
               parity.rollout            the rollout lane (vLLM against the trainers; docs/rollout.md)
  7 scripts    benchmarks/, ci/          anything below, engines only through the spec registry

An import is an import statement at any depth, an `importlib.import_module` / `__import__` call with a constant
name, or a string that names one of our modules ('parity.harness.run.worker', 'parity.engines.hf.engine:HFEngine'): the
forkserver's preload, `-m` command lines and specs' import paths reach modules that way.

Engine facts live in EngineSpec: outside engines/, no string in code (docstrings aside) is a built-in engine's name,
alias or retired name. Scripts describe the scenarios they run as YAML text, as scenarios/*.yaml do.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from parity.engines.specs import BUILTIN

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"parity.harness": REPO / "harness", "parity.engines": REPO / "engines", "parity.reports": REPO / "reports",
         "parity.examples": REPO / "parity_examples", "parity.reference": REPO / "reference",
         "parity.rollout": REPO / "rollout",
         "benchmarks": REPO / "benchmarks", "ci": REPO / "ci"}
LAYERS = [("parity.harness.contract", 0), ("parity.engines", 1), ("parity.examples", 1), ("parity.reference", 1),
          ("parity.harness.config", 2), ("parity.harness.run", 3), ("parity.harness.judge", 4),
          ("parity.reports", 5), ("parity.harness", 6), ("parity.rollout", 6), ("benchmarks", 7), ("ci", 7)]
#: the one orchestration module that may import an engine module: the spec registry, and only the specs
ENGINE_DOOR = {"parity.harness.config.registry": {"parity.engines.specs"}}
ENGINE_NAMES = {name for spec in BUILTIN for name in (spec.name, *spec.aliases, *spec.retired)}
MODULE_PATH = re.compile(r"parity(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")
IMPORT_CALLS = {"import_module", "__import__"}


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


def documentation(tree: ast.AST) -> set[int]:
    """ids of the string constants that are documentation: docstrings and attribute docstrings (a string
    expression statement)."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def code_strings(tree: ast.AST) -> list[ast.Constant]:
    """The whole string constants of the code: not documentation, not the literal parts of an f-string."""
    skip = documentation(tree) | {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                                  for part in node.values}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip]


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import, at any depth (lazy imports inside functions count too), every
    importlib call with a constant name and every string naming one of our modules."""
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
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in IMPORT_CALLS):
            out.append((node.lineno, node.args[0].value))
    out += [(node.lineno, node.value.partition(":")[0]) for node in code_strings(tree)
            if MODULE_PATH.fullmatch(node.value)]
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


def engine_names(name: str, path: Path) -> list[str]:
    """Built-in engine names written as strings outside the engines (their facts belong in their EngineSpec)."""
    if layer(name) == 1 and name.startswith("parity.engines"):
        return []
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    return [f"{shown}:{node.lineno}: engine name {node.value!r} (an engine fact: put it in the engine's spec)"
            for node in code_strings(ast.parse(path.read_text(), str(path))) if node.value in ENGINE_NAMES]


def test_the_package_has_every_layer():
    assert {layer(name) for name in MODULES} == set(range(8)), "a layer is empty: the test would prove nothing"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_run_down_the_layers(name):
    assert violations(name, MODULES[name]) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_engine_name_outside_the_engines(name):
    assert engine_names(name, MODULES[name]) == []


def _planted(tmp_path: Path, planted: dict[str, str], check) -> dict[str, list[str]]:
    found = {}
    for name, source in planted.items():
        path = tmp_path / f"{name.replace('.', '_')}.py"
        path.write_text(source)
        found[name] = check(name, path)
    return found


def test_the_check_catches_an_upward_and_a_sideways_import(tmp_path):
    """The rule itself, on planted modules: an engine importing the runner, a verdict importing the launcher's
    caller, an orchestration module importing an engine module directly, the same through importlib, a string
    import path and a benchmark; the registry's own door stays open."""
    found = _planted(tmp_path, {
        "parity.engines.bad": "from parity.harness.runner import Runner\n",
        "parity.harness.judge.bad": "import parity.harness.cli\n",
        "parity.harness.run.bad": "def f():\n    from parity.engines.fsdp2.engine import FSDP2Engine\n",
        "parity.harness.config.fine": "from parity.engines.specs import BUILTIN\n",
        "parity.harness.run.lazy": "import importlib\nimportlib.import_module('parity.harness.session')\n",
        "parity.harness.judge.dunder": "__import__('parity.reports.html')\n",
        "parity.harness.run.by_path": "PRELOAD = ('torch', 'parity.engines.hf.engine')\n",
        "parity.harness.judge.spec_path": "RULES = 'parity.engines.megatron.rules:micro_batch_rows'\n",
        "benchmarks.bad": "from parity.engines.megatron import MegatronEngine\n",
        "ci.fine": "import parity.harness.cli\nMODULES = ('parity.harness.runner',)\n",
        "parity.harness.run.documented": '"""Ranks run parity.harness.session\'s loop."""\n',
    }, violations)
    assert "upward" in found["parity.engines.bad"][0]
    assert "upward" in found["parity.harness.judge.bad"][0]
    assert "only the spec registry" in found["parity.harness.run.bad"][0]
    assert "only the spec registry" in found["parity.harness.config.fine"][0]  # only registry.py holds the door
    assert "imports parity.harness.session: layer 3 imports layer 6" in found["parity.harness.run.lazy"][0]
    assert "upward" in found["parity.harness.judge.dunder"][0]
    assert "only the spec registry" in found["parity.harness.run.by_path"][0]
    assert "imports parity.engines.megatron.rules" in found["parity.harness.judge.spec_path"][0]
    assert "only the spec registry" in found["benchmarks.bad"][0]
    assert found["ci.fine"] == [] and found["parity.harness.run.documented"] == []


def test_the_check_catches_an_engine_name_outside_the_engines(tmp_path):
    found = _planted(tmp_path, {
        "parity.harness.judge.bad": 'def ref(s):\n    return s.model_copy(update={"strategy": "hf"})\n',
        "parity.harness.config.alias": 'FAMILIES = {"fsdp": 1}\n',
        "parity.harness.config.retired": 'OLD = ("mindspeed_llm",)\n',
        "benchmarks.bad": 'LAYOUTS = {"megatron": [{"tp": 2}]}\n',
        "parity.harness.judge.fine": '"""Judged against the hf engine."""\nX = "hf_fp32"\nY = f"{1}megatron"\n',
        "parity.engines.fine": 'NAME = "megatron"\n',
    }, engine_names)
    assert [len(found[name]) for name in ("parity.harness.judge.bad", "parity.harness.config.alias",
                                          "parity.harness.config.retired", "benchmarks.bad")] == [1, 1, 1, 1]
    assert "engine name 'hf'" in found["parity.harness.judge.bad"][0]
    assert found["parity.harness.judge.fine"] == [] and found["parity.engines.fine"] == []
