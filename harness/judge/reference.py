"""Which runs a scenario is compared with, and how they are keyed in the on-disk cache.

A reference is computed once per distinct (model, workload, reference kind) and reused by every scenario
that shares it, across invocations (the key includes torch/transformers versions and the model identity).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
from pathlib import Path

from parity.harness.config.models import expand_model_path, model_identity
from parity.harness.contract.schema import Layout, Scenario


def reference_scenario(scenario: Scenario) -> Scenario | None:
    """The run to compare against; None for a stored golden (read from disk instead)."""
    if scenario.reference == "hf_fp32":
        return Scenario(model=scenario.model, strategy="hf", workload=scenario.workload, dtype="fp32",
                        device="cpu", timeout=scenario.timeout, source=scenario.source)
    if scenario.reference == "single_rank":
        return scenario.model_copy(update={"layout": Layout(), "faults": (), "name": "single-rank"})
    return None


def golden_dir(scenario: Scenario) -> Path:
    return Path(expand_model_path(scenario.reference.removeprefix("golden:")))


def baseline_scenario(scenario: Scenario) -> Scenario | None:
    """Three-way lane: the hf engine at the candidate's dtype and device."""
    if scenario.baseline is None:
        return None
    precision = "master_weights" if scenario.baseline == "hf_master_weights" else "autocast"
    return Scenario(model=scenario.model, strategy="hf", workload=scenario.workload, dtype=scenario.dtype,
                    device=scenario.device, timeout=scenario.timeout, source=scenario.source,
                    engine_kwargs={"precision": precision}, name=f"baseline-{precision}")


def cache_key(run: Scenario) -> str:
    versions = []
    for package in ("torch", "transformers", "megatron-core"):
        try:
            versions.append(f"{package}={md.version(package)}")
        except md.PackageNotFoundError:
            continue
    blob = "|".join([run.content_hash(), model_identity(run.model), *versions])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]
