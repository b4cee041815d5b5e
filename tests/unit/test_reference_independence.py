"""The reference stands alone: the modules the HF fp32 reference imports and those any candidate engine imports
share nothing but the inputs' contract (the workload, the model builder, the planted faults, what is measured). A new
shared module — a candidate's loss, optimizer or schedule reached from the reference, or the reference's math reached
from a candidate — fails here, by name, so a bug in it cannot PASS on both sides at once."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

from parity.engines.specs import BUILTIN
from parity.harness.config.registry import REFERENCE

ROOT = Path(__file__).resolve().parents[2]
#: the installed namespace's folders (pyproject [tool.setuptools.package-dir])
FOLDERS = {"parity.harness": "harness", "parity.engines": "engines", "parity.reference": "reference",
           "parity.reports": "reports", "parity.examples": "parity_examples"}

ALLOWED_SHARED = {
    "parity.harness.contract.schema": "the scenario and workload: the inputs both sides are given",
    "parity.harness.contract.workload": "the seeded batch both sides train on",
    "parity.harness.contract.engine": "the engine interface and its output types",
    "parity.harness.contract.spec": "torch-free engine facts",
    "parity.engines.specs": "torch-free engine facts",
    "parity.harness.contract.faults": "planted defects, which a row applies to the side it plants them in",
    "parity.harness.contract.fingerprint": "the forward's per-module statistics: what is measured (a diagnosis that "
                                           "names the first divergent module, never a verdict), not computed",
    "parity.harness.contract.grad_groups": "the per-module fingerprint's grouping: what is measured, not computed",
    "parity.harness.contract.optim_state": "reads an optimizer's step count back; plants the zeroed-moments fault",
    "parity.engines.hf.common": "the model builder (transformers' from_pretrained), the model's inputs, the router "
                                "load counter, the hf checkpoint files",
    "parity.engines.feeds": "the packed feed of the inputs: the reference itself always runs padded "
                            "(Workload.padded); packing is only ever a candidate's",
}
"""Shared modules and why they may be: the contract that defines the inputs and what is measured. The import
walk does not continue through them (their own imports are not the reference's code)."""


def module_file(name: str) -> Path | None:
    for prefix, folder in FOLDERS.items():
        if name == prefix or name.startswith(prefix + "."):
            base = ROOT / folder / Path(*name[len(prefix) + 1:].split(".")) if name != prefix else ROOT / folder
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
    return None


def direct_imports(name: str) -> set[str]:
    """The project modules `name` imports anywhere in its source (function-level imports included)."""
    path = module_file(name)
    if path is None:
        return set()
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}")}
            found |= submodules or {node.module}
    return {m for m in found if m.startswith("parity.") and module_file(m) is not None}


def expand(roots: Iterable[str]) -> set[str]:
    """Roots as a spec names them; a package (the spec's `source` may name one) counts with its modules."""
    names = set()
    for name in roots:
        path = module_file(name)
        names.add(name)
        if path is not None and path.name == "__init__.py":
            names |= {f"{name}.{p.stem}" for p in path.parent.glob("*.py") if p.stem != "__init__"}
    return names


def closure(roots: Iterable[str], allowed: Iterable[str] = ALLOWED_SHARED,
            imports: dict[str, set[str]] | None = None) -> set[str]:
    """Every project module reachable from `roots`, not walking on through the allowed contract modules."""
    stop, seen, todo = set(allowed), set(), list(expand(roots) if imports is None else roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name not in stop:
            todo += imports.get(name, set()) if imports is not None else direct_imports(name)
    return seen


def shared_beyond_contract(reference: set[str], candidates: set[str]) -> set[str]:
    """Modules both reach, less the contract and package __init__s that import nothing of the project."""
    return {m for m in reference & candidates
            if m not in ALLOWED_SHARED and not (module_file(m).name == "__init__.py" and not direct_imports(m))}


CANDIDATES = [spec for spec in BUILTIN if spec.name != REFERENCE.name]


def test_the_reference_imports_its_own_math_and_no_candidates():
    reference = closure(REFERENCE.modules)
    assert "parity.reference.losses" in reference and "parity.reference.optim" in reference
    for forbidden in ("parity.harness.contract.losses", "parity.harness.contract.schedule",
                      "parity.engines.training"):
        assert forbidden not in reference, f"the reference reaches the candidates' {forbidden}"


@pytest.mark.parametrize("spec", CANDIDATES, ids=lambda s: s.name)
def test_no_candidate_shares_a_module_with_the_reference_beyond_the_contract(spec):
    shared = shared_beyond_contract(closure(REFERENCE.modules), closure(spec.modules))
    assert not shared, (f"{spec.name} and the reference ({REFERENCE.name}) both import {sorted(shared)}: a bug "
                        "there would PASS on both sides; give the reference its own (parity.reference) or, if it "
                        "only defines the inputs, list it in ALLOWED_SHARED with why")


def test_a_planted_shared_loss_module_is_caught():
    """The walk on a planted graph: the reference's engine imports the candidates' loss module through a helper;
    a clean twin reaches only the contract."""
    graph = {"ref.engine": {"ref.helper", "parity.harness.contract.schema"},
             "ref.helper": {"parity.harness.contract.losses"},
             "cand.engine": {"parity.harness.contract.losses", "parity.harness.contract.schema"}}
    planted = closure(["ref.engine"], imports=graph) & closure(["cand.engine"], imports=graph)
    assert planted - set(ALLOWED_SHARED) == {"parity.harness.contract.losses"}
    graph["ref.helper"] = {"parity.harness.contract.workload"}
    clean = closure(["ref.engine"], imports=graph) & closure(["cand.engine"], imports=graph)
    assert clean - set(ALLOWED_SHARED) == set()


def test_the_walk_reads_function_level_imports():
    """A lazy import inside a function counts: the megatron engine imports the schedule inside a method."""
    assert "parity.harness.contract.schedule" in direct_imports("parity.engines.megatron.engine")
