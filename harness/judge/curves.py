"""A long run's per-step curves in the three-way lane: the candidate's loss / pre-clip grad-norm error against the
fp32 reference over the low-precision baseline's, as medians over a window of steps.

One step's ratio is one draw, heavy-tailed over clean runs (docs/tolerances.md), so the judged value at step k is
median(candidate's relative errors over steps k-W+1..k) / median(the baseline's over the same steps): a defect that
lifts the candidate's error over several steps moves the median, one noisy step does not. Opt-in per scenario
(`tolerance.ratio_step_median`), judged from the W-th step."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from parity.harness.judge.checks import Check
from parity.harness.judge.tolerances import Limits

#: a baseline's windowed median relative error below this counts as this (a near-exact window of the baseline
#: must not turn the candidate's rounding into a large ratio)
STEP_RATIO_FLOOR = 1e-3
LABELS = {"loss": "loss", "grad_norm": "pre-clip grad norm"}


def windowed_ratios(candidate: Sequence[float], baseline: Sequence[float], window: int) -> list[float | None]:
    """Per step (None before the first full window): median of the candidate's window / median of the baseline's,
    the baseline's floored at STEP_RATIO_FLOOR. A non-finite error in the candidate's window makes it inf."""
    out: list[float | None] = []
    for end in range(1, len(candidate) + 1):
        if end < window or end > len(baseline):
            out.append(None)
            continue
        ours, theirs = candidate[end - window:end], baseline[end - window:end]
        if not all(math.isfinite(v) for v in ours):
            out.append(math.inf)
            continue
        out.append(statistics.median(ours) / max(statistics.median(theirs), STEP_RATIO_FLOOR))
    return out


def step_ratio_checks(name: str, candidate: Sequence[float], baseline: Sequence[float],
                      limits: Limits) -> tuple[list[Check], list[float | None]]:
    """The windowed ratio checks of one per-step series (empty unless the scenario opts in), and the ratios."""
    window = limits.ratio_step_window
    ratios = windowed_ratios(candidate, baseline, window)
    if limits.ratio_step_median is None:
        return [], ratios
    checks = [Check(f"{LABELS[name]} rel diff ratio to baseline (median over {window} steps)", ratio,
                    limits.ratio_step_median, step=index + 1, lane="ratio",
                    note=f"steps {index + 2 - window}-{index + 1}")
              for index, ratio in enumerate(ratios) if ratio is not None]
    return checks, ratios
