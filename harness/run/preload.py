"""Which launcher a run gets, what the warm forkserver imports for a set of planned scenarios, and what it must not
import. Torch-free: the pytest plugin asks at collection time and the CLI before it imports the runner, so that
the server's imports can start before their own."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from parity.harness.config.devices import DEVICE_KINDS
from parity.harness.config.registry import REFERENCE, preload_excludes, preload_modules, spec_for
from parity.harness.config.validate import skip_reason
from parity.harness.contract.schema import Scenario
from parity.harness.contract.spec import EngineSpec

BASE = ("parity.harness.run.rank_warnings", "torch", "parity.harness.run.worker")
"""Before any engine: the warning capture first (rank_warnings' docstring), then what every rank runs."""


def planned_here(scenarios: Iterable[Scenario]) -> tuple[list[EngineSpec], list[str]]:
    """Engine specs and models of the scenarios that can run here: a skipped MindSpeed row would otherwise keep
    megatron out, and every Megatron rank would import it itself."""
    runnable = [s for s in scenarios if skip_reason(s) is None]
    # their references and baselines run on the same server (computed, or recomputed from the cache to recheck it)
    judged = [REFERENCE] if any(s.reference == "hf_fp32" or s.baseline for s in runnable) else []
    specs = list({spec.name: spec for spec in [*map(spec_for, runnable), *judged]}.values())
    return specs, list(dict.fromkeys(s.model for s in runnable))


def forkserver_preload(scenarios: Iterable[Scenario]) -> tuple[list[str], list[str]]:
    """(modules to preload, top-level modules the server must not hold) for these planned scenarios."""
    scenarios = list(scenarios)
    specs, models = planned_here(scenarios)
    shimmed = shim_bound(s for s in scenarios if skip_reason(s) is None)
    return [*BASE, *preload_modules(specs, models, shimmed)], sorted(preload_excludes(specs) | shimmed)


def shim_bound(scenarios: Iterable[Scenario]) -> set[str]:
    """Top-level modules each rank must import after its device's cuda_api_shim (EngineSpec.cuda_apis): a
    forkserver that held them would hand the ranks torch.cuda's own functions."""
    return {top for s in scenarios if DEVICE_KINDS[s.device].cuda_api_shim for top in spec_for(s).cuda_apis}


def launcher_for(scenario: Scenario, asked: str, node_rank: int | None) -> Literal["forked", "torchrun"]:
    """torchrun when asked for, and for every run spanning nodes (or launching one node of several)."""
    multi_node = scenario.layout.nodes > 1 or node_rank is not None
    return "torchrun" if asked == "torchrun" or multi_node else "forked"


def forks_here(scenarios: Iterable[Scenario], asked: str, node_rank: int | None) -> bool:
    """Whether any of these planned scenarios runs here on the forked launcher: only then is there a forkserver to
    start before the first launch (the one forkserver_preload of the same scenarios gives, as the Runner's does)."""
    return any(skip_reason(s) is None and launcher_for(s, asked, node_rank) == "forked" for s in scenarios)
