"""Which runs a scenario is compared with, and how they are keyed in the on-disk cache.

A reference is computed once per distinct (model, workload, reference kind) and reused by every scenario
that shares it, across invocations (the key includes torch/transformers versions and the model identity).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
from pathlib import Path
from typing import Any

from parity.harness.config.models import expand_model_path, model_identity
from parity.harness.config.registry import REFERENCE, spec_for
from parity.harness.contract.schema import Layout, Scenario, Workload


def reference_scenario(scenario: Scenario) -> Scenario | None:
    """The run to compare against; None for a stored golden (read from disk instead)."""
    if scenario.reference == "hf_fp32":  # a packed run is judged against the same padded reference
        return Scenario(model=scenario.model, strategy=REFERENCE.name, workload=scenario.workload.padded(),
                        dtype="fp32", device="cpu", timeout=scenario.timeout, source=scenario.source)
    if scenario.reference == "single_rank":
        return scenario.model_copy(update={"layout": Layout(), "faults": (), "name": "single-rank"})
    return None


def golden_dir(scenario: Scenario) -> Path:
    return Path(expand_model_path(scenario.reference.removeprefix("golden:")))


def baseline_scenario(scenario: Scenario) -> Scenario | None:
    """Three-way lane: the reference engine at the candidate's dtype and device, as the named baseline runs it."""
    if scenario.baseline is None:
        return None
    recipe = REFERENCE.reference
    assert recipe is not None
    baseline = recipe.baselines[scenario.baseline]
    return Scenario(model=scenario.model, strategy=REFERENCE.name, workload=scenario.workload.padded(),
                    dtype=scenario.dtype, device=scenario.device, timeout=scenario.timeout, source=scenario.source,
                    name=f"baseline-{baseline.label}", **{recipe.kwargs_block: dict(baseline.kwargs)})


HARNESS_CODE = ("parity.harness.contract", "parity.harness.run.worker")
"""The harness's modules whose source computes every run (the engine's own come from its spec)."""
REFERENCE_CODE = (*REFERENCE.modules, *HARNESS_CODE)
"""What a reference run's numbers depend on: an edit to any of these must not reuse an old cached reference."""


def code_hash(modules: tuple[str, ...] = REFERENCE_CODE) -> str:
    """sha256 over the source files of `modules` (a package counts with every .py file beside its __init__),
    located without importing them."""
    digest = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        files = sorted(origin.parent.glob("*.py")) if spec.submodule_search_locations else [origin]
        for path in files:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def run_identity(run: Scenario) -> dict[str, Any]:
    """What a golden must agree on with the scenario judged against it (stored in every record's provenance):
    the model by content, every workload field (defaults too; packing aside), the dtype, and the faults."""
    return {"model": run.model, "model_identity": model_identity(run.model),
            "workload": _workload_fields(run.workload.padded()), "dtype": run.dtype,
            "faults": [fault.model_dump(mode="json") for fault in run.faults]}


def _workload_fields(workload: Workload) -> dict[str, Any]:
    """Every field, defaults included (the JSON dump leaves some defaults out to keep old content hashes). A
    packed run is the padded one fed another way: identity takes `padded()`."""
    return {name: getattr(workload, name) for name in Workload.model_fields}


def golden_mismatch(provenance: dict[str, Any], scenario: Scenario) -> list[str]:
    """Why a golden cannot judge the scenario: its recorded identity differs ('workload.seed 1234 vs 7', 'dtype
    fp32 vs bf16'), or it was recorded with faults (a golden is a clean run)."""
    want = run_identity(scenario)
    missing = [key for key in want if key not in provenance]
    if missing:
        return [f"no recorded {', '.join(missing)} (a golden recorded before provenance was stored: record it "
                "again)"]
    problems = []
    if provenance["model_identity"] != want["model_identity"]:
        problems.append(f"model {provenance['model']} ({provenance['model_identity']}) vs {want['model']} "
                        f"({want['model_identity']})")
    try:
        stored = _workload_fields(Workload.model_validate(provenance["workload"]).padded())
    except ValueError as exc:
        return [*problems, f"its recorded workload is not valid: {exc}"]
    problems += [f"workload.{key} {stored[key]!r} vs {value!r}" for key, value in want["workload"].items()
                 if stored[key] != value]
    if provenance["dtype"] != want["dtype"]:
        problems.append(f"dtype {provenance['dtype']} vs {want['dtype']}")
    if provenance["faults"]:
        kinds = ", ".join(str(fault.get("kind")) for fault in provenance["faults"])
        problems.append(f"it was recorded with faults ({kinds}): not a clean reference")
    return problems


def cache_key(run: Scenario) -> str:
    versions = []
    for package in ("torch", "transformers", "megatron-core"):
        try:
            versions.append(f"{package}={md.version(package)}")
        except md.PackageNotFoundError:
            continue
    spec = spec_for(run)
    modules = REFERENCE_CODE if spec.name == REFERENCE.name else (*REFERENCE_CODE, *spec.modules)
    blob = "|".join([run.content_hash(), model_identity(run.model), code_hash(tuple(filter(None, modules))),
                     *versions])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]
