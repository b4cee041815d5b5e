"""The registry of engine specs: strategy names and third-party import paths -> EngineSpec -> engine class.

The ONLY way the orchestration reaches engines: it reads specs (torch-free) and imports an engine class lazily
by the spec's import path, so an NPU engine's imports never run on a CPU box.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING, Any

from parity.engines.specs import ALIASES as ALIASES
from parity.engines.specs import BUILTIN, SPECS, TRANSFORMERS_WARM, VERL_VOCABULARY, canonical
from parity.engines.specs import RETIRED as RETIRED
from parity.harness.config.models import hf_modeling_module, model_shape
from parity.harness.contract.schema import Scenario
from parity.harness.contract.spec import EngineSpec, open_spec

if TYPE_CHECKING:
    from parity.harness.contract.engine import Engine

_REFERENCES = [spec for spec in BUILTIN if spec.reference is not None]
if len(_REFERENCES) != 1:
    raise RuntimeError(f"exactly one built-in engine computes references; these say they do: {_REFERENCES}")
REFERENCE: EngineSpec = _REFERENCES[0]
"""The engine that computes references and baselines (its spec's ReferenceRecipe)."""
BASELINES: tuple[str, ...] = tuple(REFERENCE.reference.baselines) if REFERENCE.reference else ()
"""The three-way lane's baselines a scenario may name."""


def import_from_cwd() -> None:
    """Third-party engines in the working tree are importable, as pytest's rootdir makes them: first on the path,
    so that a package of the working tree wins over an installed one of the same name (verl's wheel installs a
    top-level `tests` package)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def engine_import_problem(path: str) -> str | None:
    """Why a third-party engine's module cannot be found (ranks search the working directory too)."""
    module = path.partition(":")[0]
    import_from_cwd()
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return None if found else (f"engine module '{module}' is not importable: install its package or run from "
                               "the directory that holds it")


def verl_vocabulary() -> Any:
    """engines/verl/vocabulary.py: `translate` (a `verl:` block), `vocabulary` (which verl version's names),
    `RefusedKey` (torch-free)."""
    return importlib.import_module(VERL_VOCABULARY)


def import_path(path: str) -> Any:
    """The object a spec names as 'package.module:attribute'."""
    module_name, _, attr = path.partition(":")
    import_from_cwd()
    return getattr(importlib.import_module(module_name), attr)


@cache
def third_party_spec(path: str) -> EngineSpec:
    """The `spec` a third-party engine class declares (renamed to its import path), or an open one."""
    label = path.rsplit(":", 1)[-1]
    declared = getattr(import_path(path), "spec", None)
    if isinstance(declared, EngineSpec):
        return dataclasses.replace(declared, name=label, engine=path, aliases=(), retired={})
    return open_spec(label, path)


def spec_for(scenario: Scenario) -> EngineSpec:
    if scenario.engine is not None:
        return third_party_spec(scenario.engine)
    return SPECS[canonical(scenario.strategy or "")]


def load_engine_class(scenario: Scenario) -> type[Engine]:
    from parity.harness.contract.engine import Engine

    spec = spec_for(scenario)
    cls = import_path(spec.engine)
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise TypeError(f"{spec.engine} is not a subclass of parity.harness.contract.engine.Engine")
    return cls


def check_environment(spec: EngineSpec) -> str | None:
    """The spec's environment check (e.g. a MindSpeed <-> megatron-core pairing), run only when its
    requirements are present."""
    if spec.environment_check is None or spec.missing():
        return None
    return import_path(spec.environment_check)()


def checkpoint_problem(spec: EngineSpec) -> str | None:
    """The spec's checkpoint check (resume / convert rows only), run only when its requirements are present."""
    if spec.checkpoint_check is None or spec.missing():
        return None
    return import_path(spec.checkpoint_check)()


def upstream_defect(spec: EngineSpec, scenario: Scenario) -> str | None:
    """The spec's known upstream defect this row would hit on the installed release, run only when its
    requirements are present."""
    if spec.upstream_defects is None or spec.missing():
        return None
    shape = model_shape(scenario.model)
    return import_path(spec.upstream_defects)(scenario, shape)


def preload_excludes(specs: list[EngineSpec]) -> set[str]:
    """Top-level modules no planned engine may find imported already (MindSpeed patches megatron first)."""
    return {top for spec in specs for top in spec.preload_excludes}


def preload_modules(specs: list[EngineSpec], models: Iterable[str] = (),
                    also_excluded: Iterable[str] = ()) -> list[str]:
    """Modules the forkserver imports once for these engines. A spec whose preload touches a module another
    planned engine must import itself first (MindSpeed patches megatron before megatron is imported) is left
    out whole; so is one whose requirements are missing here. Where transformers is preloaded and no planned
    engine patches while loading, the planned models' modeling modules come too (otherwise each rank imports
    them, a large share of a tiny scenario; a module that does not import is skipped by the forkserver), and so does
    transformers' checkpoint conversion table (engines/transformers_warm.py). `also_excluded`: top-level modules a
    rank must import itself for another reason (after a device's cuda_api_shim)."""
    excluded = preload_excludes(specs) | set(also_excluded)
    modules: list[str] = []
    for spec in specs:
        if spec.missing() or any(m.split(".")[0] in excluded for m in spec.preload):
            continue
        modules += [m for m in spec.preload if m not in modules]
    if "transformers" in modules and not excluded:
        modeling = (hf_modeling_module(model) for model in models)
        modules += [*TRANSFORMERS_WARM, *dict.fromkeys(m for m in modeling if m)]
    return modules
