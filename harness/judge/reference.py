"""Which runs a scenario is compared with, and how they are keyed in the on-disk cache.

A reference is computed once per distinct (model, workload, reference kind) and reused by every scenario
that shares it, across invocations (the key includes torch/transformers versions and the model identity).
"""

from __future__ import annotations

import ast
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
"""The harness's modules whose source computes every run (the engine's own come from its spec); with every parity
module they import (the tiny-model builder and its weight seed, the rank's seeding and determinism settings, ...)."""
REFERENCE_CODE = (*REFERENCE.modules, *HARNESS_CODE)
"""What a reference run's numbers depend on: an edit to any of these must not reuse an old cached reference."""


class Sources:
    """The bytes of parity's source files as this session first read them. The ranks run what the forkserver
    imported when the session started, so a cache key is taken from these bytes, never from the tree as it is when
    the key is computed; `changed()` names the files edited since (an entry is then not written)."""

    def __init__(self) -> None:
        self._digests: dict[Path, str] = {}

    def digest(self, path: Path) -> str:
        if path not in self._digests:
            self._digests[path] = hashlib.sha256(path.read_bytes()).hexdigest()
        return self._digests[path]

    def snapshot(self, paths: list[Path]) -> Sources:
        """Read these files now (before the forkserver starts)."""
        for path in paths:
            self.digest(path)
        return self

    def changed(self) -> list[Path]:
        return [path for path, digest in self._digests.items()
                if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest]


def _parity_imports(path: Path) -> list[str]:
    """Absolute `parity.*` imports anywhere in a file (function-level lazy imports too); `from parity.x import y`
    names both parity.x and parity.x.y (y may be a module)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("parity.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("parity."):
            found += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]  # type: ignore[list-item]
    return found


def _locate(name: str) -> tuple[Path, bool] | None:
    """(source file, is a package) of a module: one of parity's found on disk without importing it or any parent
    beyond parity's top-level package (whose package-dir mapping says where each part lives), None for a name that
    is an attribute of a module (`from parity.x import function`); another package's by its import spec."""
    parts = name.split(".")
    if parts[0] != __name__.split(".")[0]:  # another package's module named by a spec (a third-party engine)
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return None
        return Path(spec.origin), bool(spec.submodule_search_locations)
    if len(parts) < 2:
        return None
    try:
        spec = importlib.util.find_spec(".".join(parts[:2]))
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    if not spec.submodule_search_locations:
        return (Path(spec.origin), False) if len(parts) == 2 else None
    where = Path(next(iter(spec.submodule_search_locations)))
    for index, part in enumerate(parts[2:], start=3):
        if (where / part / "__init__.py").is_file():
            where = where / part
        elif (where / f"{part}.py").is_file():
            return (where / f"{part}.py", False) if index == len(parts) else None
        else:
            return None
    return where / "__init__.py", True


def source_files(modules: tuple[str, ...]) -> list[Path]:
    """The source files of `modules` and of every parity module they import, transitively (a package named here
    counts with every .py file beside its __init__; its parents' __init__ run on import too), found without
    importing them."""
    files: set[Path] = set()
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        located = _locate(name)
        if located is None:
            continue
        origin, package = located
        for path in sorted(origin.parent.glob("*.py")) if package and name in modules else [origin]:
            path = path.resolve()
            if path not in files:
                files.add(path)
                todo += _parity_imports(path)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]
    return sorted(files)


def code_hash(modules: tuple[str, ...] = REFERENCE_CODE, sources: Sources | None = None) -> str:
    """sha256 over the source files of `modules` and the parity modules they import, as `sources` first read them
    (a fresh read without)."""
    sources = sources or Sources()
    digest = hashlib.sha256()
    for path in source_files(tuple(filter(None, modules))):
        digest.update(path.name.encode() + b"\0" + sources.digest(path).encode())
    return digest.hexdigest()[:16]


def cache_key(run: Scenario, sources: Sources | None = None) -> str:
    """The reference's content hash, the model's identity (a checkpoint's bytes; a tiny model's config and weight
    seed, whose builder is among the code hashed), the code that computes it and the packages it runs on."""
    versions = []
    for package in ("torch", "transformers", "megatron-core"):
        try:
            versions.append(f"{package}={md.version(package)}")
        except md.PackageNotFoundError:
            continue
    spec = spec_for(run)
    modules = REFERENCE_CODE if spec.name == REFERENCE.name else (*REFERENCE_CODE, *spec.modules)
    blob = "|".join([run.content_hash(), model_identity(run.model), code_hash(modules, sources), *versions])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


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
