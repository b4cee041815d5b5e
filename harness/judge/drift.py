"""Changes in a metric over a history of runs, with a false-flag rate that holds over a whole night's scenarios.

Each metric is compared in log space (run-to-run noise of a step time is multiplicative), turned so that "worse" is
up. A series is split where its level moves (either way: an improvement starts a new baseline, so a regression
that undoes it is a change too): at each run, the runs before it since the last split (at most WINDOW) are the
baseline and the run with up to CONFIRM - 1 after it are the candidate level, compared by a pooled two-sample t
test (exact for Gaussian log-noise; a series with no noise at all, a deterministic error, changes with p = 0). A
split needs p < SPLIT_P and a move past the metric's margin by the candidate runs' lower median, so one noisy run
among them is not a level. A series whose last runs drift steadily (slope t test over at least CREEP_MIN runs, the
line fitting better than any one step) is a creep instead.

Every worse-direction split or creep gets a p-value, corrected for the positions its series was tested at by a
weighted Bonferroni that gives the latest runs half of the series' budget (RECENT_SHARE); across all series of the
history (every scenario x metric) Benjamini-Hochberg keeps the false discovery rate at FDR_Q, which under a
history with no change at all is the chance of any false flag. The rates on synthetic
histories (75 scenarios x 20 nights, log-normal noise) are printed by benchmarks/drift_rule.py and quoted in
docs/tolerances.md.

The perf gate of a scenario (`perf:` with `--history`) compares its run's median step time with the runs of the
same provenance (GATE_MIN of them at least) by the same t statistic.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from parity.harness.contract.schema import PerfGate

if TYPE_CHECKING:  # the verdict imports torch; `parity history` and the CLI's start need none
    from parity.harness.judge.verdict import Verdict

FDR_Q = 0.03
"""Benjamini-Hochberg level over every series of a history."""
SPLIT_P = 1e-3
"""One position's p-value below which the series' level is taken to have moved (a new baseline starts there)."""
WINDOW = 20
"""Runs before a position that form its baseline (after the last split)."""
MIN_BASELINE = 3
"""Fewer earlier runs than this: no verdict on the run."""
CONFIRM = 3
"""A run and up to this many - 1 runs after it form the level it is compared at (the latest run alone)."""
CREEP_MIN = 8
"""Runs since the last split that a creep (a steady drift, no step) is looked for over."""
ABS_FLOOR = 1e-12
"""Values are floored here before the log: an error of exactly 0 that becomes 1e-7 is a change."""
GATE_MIN = 3
"""Earlier runs of the same provenance a perf gate needs before it judges."""
GATE_P = 0.01
"""A perf gate FAILs only when the growth is past its limit AND this unlikely under the earlier runs' spread."""
PERF_PROVENANCE = ("scenario_hash", "versions", "device_name", "image")
"""What earlier runs must share with this one to be its perf baseline: the run itself, package versions, device."""


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


@dataclass(frozen=True, slots=True)
class Change:
    index: int
    """Position (in the series given, gaps included) of the first run at the new level; for a creep, where it
    starts."""
    before: float
    """Baseline level (geometric mean of the baseline runs)."""
    after: float
    """New level (the candidate runs' median; for a creep, the fitted last value)."""
    p: float
    """p-value, corrected for the tests its series took (weighted Bonferroni; before Benjamini-Hochberg)."""
    kind: Literal["step", "creep"] = "step"
    runs: int = 1
    """A creep: over how many runs."""

    @property
    def relative(self) -> float:
        return (self.after - self.before) / max(abs(self.before), ABS_FLOOR)


def t_sf(t: float, df: float) -> float:
    """P(T >= t) for Student's t with df degrees of freedom."""
    from scipy.special import stdtr

    return float(stdtr(df, -t))


def _oriented(values: Sequence[float], worse: str) -> list[float]:
    sign = 1.0 if worse == "up" else -1.0
    return [sign * math.log(max(v, ABS_FLOOR)) for v in values]


def _p_greater(diff: float, ss: float, df: int, scale: float) -> float:
    """One-sided p of a pooled t statistic diff / sqrt(ss / df * scale); a noiseless series: 0 or 1."""
    if df < 1:
        return 1.0
    if ss <= 0.0:
        return 0.0 if diff > 0 else 1.0
    return t_sf(diff / math.sqrt(ss / df * scale), df)


def _ss(values: Sequence[float], mean: float) -> float:
    return sum((v - mean) ** 2 for v in values)


@dataclass(frozen=True, slots=True)
class _Split:
    at: int
    p: float
    direction: int
    """+1 worse, -1 better."""
    effect: float


def _test_at(y: list[float], start: int, n: int, margin_log: float) -> list[_Split]:
    """The splits (either direction) the run at n and up to CONFIRM - 1 after it support against the baseline."""
    base, after = y[max(start, n - WINDOW):n], y[n:n + CONFIRM]
    if len(base) < MIN_BASELINE or not after:
        return []
    mb, ma = statistics.fmean(base), statistics.fmean(after)
    ss = _ss(base, mb) + _ss(after, ma)
    df, scale = len(base) + len(after) - 2, 1 / len(base) + 1 / len(after)
    ordered = sorted(after)
    low, high = ordered[(len(after) - 1) // 2], ordered[len(after) // 2]
    splits = []
    if low - mb > margin_log:
        splits.append(_Split(n, _p_greater(ma - mb, ss, df, scale), 1, low - mb))
    if mb - high > margin_log:
        splits.append(_Split(n, _p_greater(mb - ma, ss, df, scale), -1, mb - high))
    return splits


def _creep(y: list[float], start: int, margin_log: float) -> tuple[float, float, float] | None:
    """(p, fitted rise over the segment, its last fitted value) of a steady rise over y[start:], when the line fits
    better than any single step; None otherwise."""
    seg = y[start:]
    n = len(seg)
    if n < CREEP_MIN:
        return None
    xs = range(n)
    mx, my = (n - 1) / 2, statistics.fmean(seg)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (v - my) for x, v in zip(xs, seg, strict=True)) / sxx
    rss_line = sum((v - (my + slope * (x - mx))) ** 2 for x, v in zip(xs, seg, strict=True))
    rise = slope * (n - 1)
    if rise <= margin_log:
        return None
    rss_step = min(_ss(seg[:k], statistics.fmean(seg[:k])) + _ss(seg[k:], statistics.fmean(seg[k:]))
                   for k in range(1, n))
    if rss_step <= rss_line:
        return None
    p = _p_greater(slope, rss_line, n - 2, 1 / sxx)
    return p, rise, my + slope * (n - 1 - mx)


def series_changes(values: Sequence[float | None], worse: str, margin: float) -> tuple[list[Change], int]:
    """Worse-direction changes of one series with their (position-corrected) p-values, and how many tests the
    series took. Missing values (SKIP / ERROR runs) are left out; indices refer to `values`."""
    where = [i for i, v in enumerate(values) if v is not None and not math.isnan(v)]
    if len(where) <= MIN_BASELINE:
        return [], 0
    raw = [float(values[i]) for i in where]  # type: ignore[arg-type]
    y = _oriented(raw, worse)
    margin_log = math.log1p(margin)
    sign = 1.0 if worse == "up" else -1.0

    def creep_change(start: int) -> Change | None:
        creep = _creep(y, start, margin_log)
        if creep is None or creep[0] >= SPLIT_P:
            return None
        p, rise, last = creep
        return Change(where[start], math.exp(sign * (last - rise)), math.exp(sign * last), p, "creep", len(y) - start)

    weight = _weights(len(y))
    whole = creep_change(0)  # a drift over the whole history would otherwise read as a staircase of steps
    if whole is not None:
        return [Change(whole.index, whole.before, whole.after, min(1.0, whole.p / weight(None)), "creep",
                       whole.runs)], len(y)
    found: list[tuple[_Split, int]] = []
    start, n = 0, MIN_BASELINE
    while n < len(y):
        splits = [s for s in _test_at(y, start, n, margin_log) if s.p < SPLIT_P]
        if not splits:
            n += 1
            continue
        # the best split among this run and the next ones (a step at n also shows, weaker, at n - 1)
        nearby = [s for k in range(n, min(n + CONFIRM, len(y))) for s in _test_at(y, start, k, margin_log)
                  if s.direction == splits[0].direction and s.p < SPLIT_P]
        best = min(nearby, key=lambda s: (s.p, -s.effect))
        found.append((best, start))
        start, n = best.at, best.at + MIN_BASELINE
    changes = []
    for split, begin in found:
        if split.direction < 0:
            continue
        base = [math.log(max(v, ABS_FLOOR)) for v in raw[max(begin, split.at - WINDOW):split.at]]
        changes.append(Change(where[split.at], math.exp(statistics.fmean(base)),
                              statistics.median(raw[split.at:split.at + CONFIRM]),
                              min(1.0, split.p / weight(split.at))))
    if start > 0 and (late := creep_change(start)) is not None:
        changes.append(Change(late.index, late.before, late.after, min(1.0, late.p / weight(None)), "creep",
                              late.runs))
    return changes, len(y)


RECENT_SHARE = 0.5
"""Of a series' error budget, the share its last CONFIRM positions get (weighted Bonferroni): a change in the
latest nights is what a nightly reviewer must see at once; older positions were the latest once, and share the
rest with the two creep tests."""


def _weights(length: int) -> Callable[[int | None], float]:
    """Bonferroni weights (summing to at most 1) of a series' tests: position n, or a creep test (None)."""
    positions = range(MIN_BASELINE, length)
    recent = [n for n in positions if n >= length - CONFIRM]
    older = len(positions) - len(recent) + 2  # and the two creep tests
    recent_share = RECENT_SHARE if older else 1.0

    def weight(n: int | None) -> float:
        if n is not None and n >= length - CONFIRM:
            return recent_share / max(len(recent), 1)
        return (1.0 - recent_share) / older

    return weight


def benjamini_hochberg(pvalues: Mapping[Hashable, float], q: float = FDR_Q) -> float | None:
    """The largest p-value Benjamini-Hochberg accepts at level q over these tests; None when it accepts none. A
    p-value of 0 (a noiseless series that moved) is the strongest evidence there is, and is accepted."""
    ordered = sorted(pvalues.values())
    m = len(ordered)
    cut = None
    for k, p in enumerate(ordered, start=1):
        if p <= q * k / m:
            cut = p
    return cut


def flag_changes(series: Mapping[Hashable, tuple[Sequence[float | None], Metric]],
                 q: float = FDR_Q) -> dict[Hashable, list[Change]]:
    """The changes to flag in each series (key -> its values and metric), at false discovery rate q over all of
    them: a series' p-value is its smallest change p-value times its number of changes."""
    candidates = {key: series_changes(values, metric.worse, metric.margin)[0]
                  for key, (values, metric) in series.items()}
    pvalues = {key: min(1.0, min(c.p for c in changes) * len(changes)) if changes else 1.0
               for key, changes in candidates.items()}
    cut = benjamini_hochberg(pvalues, q)
    if cut is None:
        return {}
    return {key: [c for c in changes if c.p * len(changes) <= cut]
            for key, changes in candidates.items() if changes and pvalues[key] <= cut}


# ---- one change across the matrix ---------------------------------------------------------------------------

MATRIX_MIN = 5
"""Scenarios with a value on a night and a baseline before it that a matrix-wide change needs."""
MATRIX_TIE = 1e-9
"""|log change| at or below which a scenario did not move that night (a noiseless series repeating its value)."""


@dataclass(frozen=True, slots=True)
class MatrixChange:
    """Most scenarios of the matrix moved the same way on one night: one change, however small each series' own
    evidence (every step time +15 % on a night of 5 % noise is no change in any one series)."""

    metric: Metric
    index: int
    """The night (position in the history) the matrix moved."""
    worse: int
    """Scenarios that moved the worse way that night (past MATRIX_TIE)."""
    better: int
    scenarios: int
    """Scenarios judged that night (a value on it and a baseline before it)."""
    relative: float
    """Median over those scenarios of the change against each one's baseline (geometric mean)."""
    p: float
    """Sign test over the scenarios that moved, Bonferroni-corrected for every night and metric tested."""


def _night_moves(values: Sequence[Sequence[float | None]], worse: str, start: int, n: int) -> list[float]:
    """Each series' oriented log change at night n against its runs since `start` (at most WINDOW, at least
    MIN_BASELINE of them)."""
    moves = []
    for series in values:
        if n >= len(series) or series[n] is None or math.isnan(series[n]):  # type: ignore[arg-type]
            continue
        base = [v for v in series[max(start, n - WINDOW):n] if v is not None and not math.isnan(v)]
        if len(base) < MIN_BASELINE:
            continue
        y = _oriented([*base, series[n]], worse)  # type: ignore[list-item]
        moves.append(y[-1] - statistics.fmean(y[:-1]))
    return moves


def _sign_p(k: int, n: int) -> float:
    """P(at least k of n fair coin flips land one way)."""
    from scipy.stats import binom

    return float(binom.sf(k - 1, n, 0.5)) if n else 1.0


def matrix_changes(series: Mapping[Hashable, tuple[Sequence[float | None], Metric]],
                   q: float = FDR_Q) -> list[MatrixChange]:
    """Nights on which most scenarios moved the same way past a metric's margin: the median change over every
    scenario judged that night is past the margin (so more than half of them moved that far) and a sign test over
    those that moved at all rejects "up and down alike" at q over all nights and metrics tested. After a night
    that moved the matrix, each series' baseline starts there (as a series' split does)."""
    by_metric: dict[Metric, list[Sequence[float | None]]] = {}
    for values, metric in series.values():
        by_metric.setdefault(metric, []).append(values)
    nights = max((len(v) for listed in by_metric.values() for v in listed), default=0)
    tests = max(1, len(by_metric) * max(0, nights - MIN_BASELINE))
    out = []
    for metric, values in by_metric.items():
        margin_log = math.log1p(metric.margin)
        start, n = 0, MIN_BASELINE
        while n < nights:
            moves = _night_moves(values, metric.worse, start, n)
            if len(moves) < MATRIX_MIN:
                n += 1
                continue
            up = sum(d > MATRIX_TIE for d in moves)
            down = sum(d < -MATRIX_TIE for d in moves)
            median = statistics.median(moves)
            for direction, k in ((1, up), (-1, down)):
                p = min(1.0, _sign_p(k, up + down) * tests)
                if direction * median > margin_log and p <= q:
                    if direction > 0:
                        out.append(MatrixChange(metric, n, up, down, len(moves), math.expm1(median)
                                                if metric.worse == "up" else math.expm1(-median), p))
                    start = n
                    break
            n = start + MIN_BASELINE if start == n else n + 1
    return out


def change_points(values: Sequence[float | None], worse: str, margin: float, q: float = FDR_Q) -> list[Change]:
    """The changes of one series alone (a history of one scenario and one metric)."""
    metric = Metric("value", "value", worse, margin, "change")  # type: ignore[arg-type]
    return flag_changes({0: (values, metric)}, q).get(0, [])


# ---- the perf gate of one run ------------------------------------------------------------------------------

GATED = (("step_time_s", "max_slowdown", "step time"), ("peak_memory_mb", "max_memory_growth", "peak memory"))


def perf_identity(provenance: Mapping[str, Any]) -> dict[str, Any]:
    return {key: provenance.get(key) for key in PERF_PROVENANCE}


def comparable(past: list[dict[str, Any]], provenance: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Earlier results (metrics and provenance) of the same provenance as this run (PERF_PROVENANCE)."""
    mine = perf_identity(provenance)
    return [result for result in past if perf_identity(result.get("provenance") or {}) == mine]


def perf_breaches(gate: PerfGate, current: dict[str, Any], past: list[dict[str, Any]]) -> list[str]:
    """Gate limits the current metrics break against earlier runs' metrics: the growth over their geometric mean
    must exceed the limit AND be unlikely (p < GATE_P, prediction t test in log space) under their spread."""
    reasons = []
    for key, field, label in GATED:
        limit, value = getattr(gate, field), current.get(key)
        known = [m[key] for m in past if isinstance(m.get(key), int | float) and m[key] > 0 and not math.isnan(m[key])]
        if limit is None or not isinstance(value, int | float) or math.isnan(value) or len(known) < GATE_MIN:
            continue
        logs = [math.log(v) for v in known]
        mean = statistics.fmean(logs)
        growth = math.exp(math.log(max(value, ABS_FLOOR)) - mean) - 1
        p = _p_greater(math.log(max(value, ABS_FLOOR)) - mean, _ss(logs, mean), len(logs) - 1, 1 + 1 / len(logs))
        if growth > limit and p < GATE_P:
            reasons.append(f"{label} {growth:+.1%} over the geometric mean of {len(known)} earlier runs of the same "
                           f"provenance ({math.exp(mean):.4g} -> {value:.4g}; p = {p:.2g} under their spread) > "
                           f"{field} {limit:.0%}")
    return reasons


def gate(verdict: Verdict, perf: PerfGate | None, past: list[dict[str, Any]]) -> Verdict:
    """FAIL the verdict (on_breach: fail) or add warnings to it (warn) for each perf limit broken; a warning when
    there are too few earlier runs of the same provenance to judge. `past`: earlier results of this scenario."""
    if perf is None or verdict.status not in ("PASS", "FAIL"):
        return verdict
    same = comparable(past, verdict.info.get("provenance") or {})
    warnings = verdict.info.setdefault("warnings", [])
    if len(same) < GATE_MIN:
        warnings.append(f"perf gate not judged: {len(same)} earlier run(s) of the same provenance "
                        f"({', '.join(PERF_PROVENANCE)}) in --history, it needs {GATE_MIN} ({len(past)} in all)")
        return verdict
    breaches = perf_breaches(perf, verdict.metrics, [r.get("metrics") or {} for r in same])
    if breaches and perf.on_breach == "fail":
        verdict.status = "FAIL"
        verdict.reasons += breaches
    else:
        warnings += breaches
    if not warnings:
        verdict.info.pop("warnings")
    return verdict
