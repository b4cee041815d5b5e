"""Calibration: the measured error distribution of clean runs per metric, and the limits it supports.

Pure functions over scenarios and verdict metrics (the `parity calibrate` command runs the scenarios). A proposed
limit is the worst clean value times a margin: a limit is only as good as the spread it was measured on
(docs/tolerances.md).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from parity.harness.contract.schema import Scenario


def seeded(scenarios: list[Scenario], seeds: int) -> list[Scenario]:
    """Every clean scenario (no faults) once per workload seed 0..seeds-1."""
    clean = [s for s in scenarios if not s.faults]
    return [s.model_copy(update={"workload": s.workload.model_copy(update={"seed": seed})})
            for seed in range(seeds) for s in clean]


#: metric name -> path into a verdict's metrics
METRICS: dict[str, tuple[str, ...]] = {
    "logprob_max_abs": ("logprob_max_abs",), "logprob_mean_abs": ("logprob_mean_abs",),
    "logprob_p99_abs": ("logprobs_after", "p99_abs"), "kl_k3": ("logprobs_after", "kl_k3"),
    "entropy_max_abs": ("entropy_after", "max_abs"), "loss_rel": ("loss_rel_max",),
    "grad_norm_rel": ("grad_norm_rel_max",),
}


def _value(metrics: dict[str, Any], path: tuple[str, ...]) -> float | None:
    node: Any = metrics
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, int | float) else None


def distribution(all_metrics: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per metric: runs, worst, median and 90th percentile over clean runs (NaN counts as the worst)."""
    out = {}
    for name, path in METRICS.items():
        values = [v for m in all_metrics if (v := _value(m, path)) is not None]
        if not values:
            continue
        finite = sorted(v for v in values if math.isfinite(v))
        worst = math.inf if len(finite) < len(values) else max(finite, default=math.nan)
        p90 = finite[min(len(finite) - 1, int(0.9 * len(finite)))] if finite else math.nan
        out[name] = {"runs": len(values), "worst": worst, "median": statistics.median(finite) if finite else math.nan,
                     "p90": p90}
    return out


def proposals(dist: dict[str, dict[str, float]], margin: float) -> dict[str, float]:
    """Proposed limit per metric: worst clean value x margin."""
    return {name: stats["worst"] * margin for name, stats in dist.items()}
