"""Change points in a metric over earlier runs, robust to noise: the baseline is the median of a window of runs
before (one noisy run in it does not move it) and a run breaches when it is worse by more than BOTH the metric's
relative margin and K robust standard deviations (1.4826 x MAD, the normal-consistent scale) of that window.
A breach is a change only if the next run breaches too (a single noisy run is not a change), except for the
latest run, which has no next run yet. asv detects steps over history the same way in spirit; comparing with the
previous run only (github-action-benchmark) made users raise thresholds to 200-400 %.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from parity.harness.contract.schema import PerfGate

if TYPE_CHECKING:  # the verdict imports torch; `parity history` and the CLI's start need none
    from parity.harness.judge.verdict import Verdict

K = 3.0
"""Robust standard deviations the confirmed level must be worse by (half of it for the first run alone); the
rates at 2 % run-to-run noise are measured by benchmarks/drift_rule.py."""
WINDOW = 20
"""Runs before the candidate that form its baseline (after the last change)."""
MIN_BASELINE = 2
"""Fewer earlier runs than this: no verdict on the run."""
CONFIRM = 3
"""A run and up to this many - 1 runs after it: their median must be at the worse level, so one noisy run is not
a change (the latest run, with none after it, is judged alone)."""
"""Fewer earlier runs than this: no verdict on the run."""


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    """Key in a result's metrics."""
    label: str
    worse: Literal["up", "down"]
    margin: float
    """Relative change below which nothing is flagged, however quiet the history."""
    kind: str
    """What a change means: error grown, slowdown, memory growth."""


METRICS = (
    Metric("logprob_max_abs", "log-prob max |Δ|", "up", 0.5, "error grown"),
    Metric("loss_rel_max", "loss rel diff", "up", 0.5, "error grown"),
    Metric("grad_norm_rel_max", "grad-norm rel diff", "up", 0.5, "error grown"),
    Metric("step_time_s", "step time", "up", 0.05, "slowdown"),
    Metric("tokens_per_s", "tokens/s", "down", 0.05, "slowdown"),
    Metric("peak_memory_mb", "peak memory", "up", 0.10, "memory growth"),
)
ABS_FLOOR = 1e-12
"""An error that was exactly 0 and is not any more is a change (relative change of 0 is undefined)."""


@dataclass(frozen=True, slots=True)
class Baseline:
    median: float
    sigma: float
    """1.4826 x median absolute deviation."""

    @classmethod
    def of(cls, values: Sequence[float]) -> Baseline:
        median = statistics.median(values)
        return cls(median, 1.4826 * statistics.median(abs(v - median) for v in values))

    def excess(self, value: float, worse: str) -> float:
        """How much worse than the median `value` is (positive = worse), in the metric's unit."""
        return value - self.median if worse == "up" else self.median - value

    def relative(self, value: float) -> float:
        return (value - self.median) / max(abs(self.median), ABS_FLOOR)

    def breached(self, value: float, worse: str, margin: float, k: float = K) -> bool:
        if math.isnan(value):
            return True
        excess = self.excess(value, worse)
        return excess > margin * max(abs(self.median), ABS_FLOOR) and excess > k * self.sigma


@dataclass(frozen=True, slots=True)
class Change:
    index: int
    """Position of the first run at the new level."""
    before: float
    """Baseline median."""
    after: float

    @property
    def relative(self) -> float:
        return (self.after - self.before) / max(abs(self.before), ABS_FLOOR)


def change_points(values: Sequence[float | None], worse: str, margin: float, k: float = K,
                  window: int = WINDOW) -> list[Change]:
    """Every change to a worse level; after one, the baseline restarts at the new level."""
    changes: list[Change] = []
    start = 0
    points = [v for v in values if v is not None]
    where = [i for i, v in enumerate(values) if v is not None]
    for n, value in enumerate(points):
        past = points[max(start, n - window):n]
        if len(past) < MIN_BASELINE:
            continue
        baseline = Baseline.of(past)
        level = statistics.median(points[n:n + CONFIRM])  # this run and the next ones, when there are
        if baseline.breached(value, worse, margin, k / 2) and baseline.breached(level, worse, margin, k):
            changes.append(Change(where[n], baseline.median, level))
            start = n
    return changes


GATED = (("step_time_s", "max_slowdown", "step time"), ("peak_memory_mb", "max_memory_growth", "peak memory"))


def perf_breaches(gate: PerfGate, current: dict[str, Any], past: list[dict[str, Any]]) -> list[str]:
    """Gate limits the current metrics break against the median of earlier runs (noise-aware as above: the
    growth must exceed the limit AND K robust standard deviations of the earlier runs)."""
    reasons = []
    for key, field, label in GATED:
        limit, value = getattr(gate, field), current.get(key)
        known = [m[key] for m in past if isinstance(m.get(key), int | float) and not math.isnan(m[key])]
        if limit is None or value is None or not known:
            continue
        baseline = Baseline.of(known)
        if baseline.breached(value, "up", limit):
            reasons.append(f"{label} {baseline.relative(value):+.1%} over the median of {len(known)} earlier runs "
                           f"({baseline.median:.4g} -> {value:.4g}) > {field} {limit:.0%}")
    return reasons


def gate(verdict: Verdict, perf: PerfGate | None, past: list[dict[str, Any]]) -> Verdict:
    """FAIL the verdict (on_breach: fail) or add warnings to it (warn) for each perf limit broken."""
    if perf is None or verdict.status not in ("PASS", "FAIL"):
        return verdict
    breaches = perf_breaches(perf, verdict.metrics, past)
    if breaches and perf.on_breach == "fail":
        verdict.status = "FAIL"
        verdict.reasons += breaches
    elif breaches:
        verdict.info["warnings"] = breaches
    return verdict
