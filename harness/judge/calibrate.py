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
    """Every clean scenario (no faults) at its own workload seed — the run the matrix makes every night, which a
    limit must hold for too — and at seeds 0..seeds-1."""
    clean = [s for s in scenarios if not s.faults]
    return [*clean, *(s.model_copy(update={"workload": s.workload.model_copy(update={"seed": seed})})
                      for seed in range(seeds) for s in clean if seed != s.workload.seed)]


#: metric name -> path into a verdict's metrics
METRICS: dict[str, tuple[str, ...]] = {
    "logprob_max_abs": ("logprob_max_abs",), "logprob_mean_abs": ("logprob_mean_abs",),
    "logprob_p99_abs": ("logprobs_after", "p99_abs"), "kl_k3": ("logprobs_after", "kl_k3"),
    "entropy_max_abs": ("entropy_after", "max_abs"), "loss_rel": ("loss_rel_max",),
    "grad_norm_rel": ("grad_norm_rel_max",),
    # three-way lane of a long run: the windowed median ratios per step (harness/judge/curves.py), their worst
    "loss_rel_ratio_windowed": ("loss_rel_ratio_windowed",),
    "grad_norm_rel_ratio_windowed": ("grad_norm_rel_ratio_windowed",),
}


def _value(metrics: dict[str, Any], path: tuple[str, ...]) -> float | None:
    node: Any = metrics
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    if isinstance(node, list):  # a per-step series: its worst step (NaN the worst)
        steps = [float(v) for v in node if isinstance(v, int | float)]
        return max(steps, key=lambda v: math.inf if math.isnan(v) else v) if steps else None
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


#: per-step relative errors a long run's band widens over (verdict metrics: one value per step), and the Limits
#: field of each one's band
BAND_SERIES: dict[str, str] = {"loss_rel": "loss_rel_per_step", "grad_norm_rel": "grad_norm_rel_per_step",
                               "group_grad_norm_rel": "group_grad_norm_rel_per_step"}


def step_envelopes(results: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per dtype and per-step series: the worst value over the clean runs at each step (NaN counts as inf; a step
    some runs lack is taken over those that have it)."""
    out: dict[str, dict[str, list[float]]] = {}
    for result in results:
        metrics, dtype = result.get("metrics") or {}, str(result.get("dtype", "fp32"))
        for series in BAND_SERIES:
            values = metrics.get(series) or []
            envelope = out.setdefault(dtype, {}).setdefault(series, [])
            for step, value in enumerate(values):
                value = math.inf if value is not None and math.isnan(value) else value
                if step == len(envelope):
                    envelope.append(-math.inf)
                if value is not None:
                    envelope[step] = max(envelope[step], value)
    return out


def band_proposals(envelopes: dict[str, dict[str, list[float]]], margin: float) -> dict[str, dict[str, float]]:
    """Per dtype, the per-step growth of each band (Limits.*_rel_per_step): the smallest slope s for which the
    dtype's own limit at step k plus s x (k - 1) covers `margin` x the worst clean value at every step k — the
    steps the base limit already covers ask for nothing."""
    from parity.harness.judge.tolerances import DEFAULTS

    proposals: dict[str, dict[str, float]] = {}
    for dtype, series in envelopes.items():
        base = DEFAULTS.get(dtype, DEFAULTS["fp32"])
        for name, envelope in series.items():
            slope = 0.0
            for index, worst in enumerate(envelope):
                step = index + 1
                if step == 1 or worst == -math.inf:
                    continue
                if name == "group_grad_norm_rel":
                    if base.group_grad_norm_rel is None:
                        break
                    floor = base.group_grad_norm_rel
                else:
                    floor = base.step_tolerance(name.removesuffix("_rel"), step)[0]
                slope = max(slope, (margin * worst - floor) / (step - 1))
            proposals.setdefault(dtype, {})[BAND_SERIES[name]] = slope
    return proposals
