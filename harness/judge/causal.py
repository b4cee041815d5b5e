"""A FAIL's reasons in the order the run computed them, so the root cause comes first: the earliest step first,
and within a step the forward (loss, log-probs, the router's expert load) before the backward (grad norms) before
the update (the learning rate it ran at). Per-module checks of one step are collapsed into one line ("34 modules
at step 2: ..."): 35 near-identical lines would bury what came before them."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from parity.harness.judge.checks import Check

FORWARD, BACKWARD, UPDATE, AFTER = 0, 1, 2, 3
"""Where in a step a check's value is computed."""

COLLAPSE_AT = 3
"""Per-module failures of one step from this many on are one line."""
KINDS_SHOWN = 6
"""Module kinds (a layer's module without its layer index) the collapsed line names, most frequent first."""


def stage(check: Check, steps: int) -> tuple[float, int]:
    """(step, phase) at which the checked value was computed. Log-probs before training are step 1's forward
    (no update has run); after the last step, they are the forward of step steps + 1; a resume or conversion
    check reads what the run left behind. A check this does not know keeps its place after the others of its
    step (phase AFTER), never before a known cause."""
    metric = check.metric
    if metric.startswith(("log-prob before", "entropy before")):
        return 1, FORWARD
    if metric.startswith(("log-prob after", "entropy after")):
        return steps + 1, FORWARD
    if metric.startswith(("resume:", "converted HF")):
        return (check.step if check.step is not None else steps + 1), AFTER
    step = check.step if check.step is not None else math.inf
    if metric.startswith("loss") or "expert load" in metric:
        return step, FORWARD
    if "grad norm" in metric:
        return step, BACKWARD
    if "learning rate" in metric:
        return step, UPDATE
    return step, AFTER


def causal_order(checks: Iterable[Check], steps: int) -> list[Check]:
    """Failing checks earliest first (a stable sort: checks of one stage keep the judge's order)."""
    return sorted((c for c in checks if not c.passed), key=lambda c: stage(c, steps))


def collapsed(group: Sequence[Check]) -> str:
    """One line for many per-module checks of one step: how many, the worst, and its limit."""
    worst = max(group, key=lambda c: c.observed / c.limit if c.limit > 0 else math.inf)
    observed = [c.observed for c in group]
    low, high = min(observed), max(observed)
    spread = f"rel {high:.3g}" if math.isclose(low, high, rel_tol=0.05) or not math.isfinite(high) else \
        f"rel {low:.3g} to {high:.3g}"
    kinds = Counter(re.sub(r"^layer \d+ ", "", c.metric.split(" grad norm")[0]) for c in group)
    named = ", ".join(f"{kind} x{count}" for kind, count in kinds.most_common(KINDS_SHOWN))
    more = f", ... {len(kinds) - KINDS_SHOWN} more" if len(kinds) > KINDS_SHOWN else ""
    return (f"{len(group)} modules at step {group[0].step}: {spread} (worst {worst.metric} = {worst.observed:.3g} "
            f"> limit {worst.limit:.3g}); which: {named}{more}")


def causal_reasons(checks: Iterable[Check], steps: int, per_module: Iterable[Check] = ()) -> list[str]:
    """The failing checks' reasons in causal order, the `per_module` ones of each step collapsed into one line
    where there are COLLAPSE_AT or more (the line stands where the first of them stood)."""
    modules = {id(c) for c in per_module}
    ordered = causal_order(checks, steps)
    by_step: dict[int | None, list[Check]] = {}
    for check in ordered:
        if id(check) in modules:
            by_step.setdefault(check.step, []).append(check)
    reasons, done = [], set()
    for check in ordered:
        group = by_step.get(check.step, []) if id(check) in modules else []
        if len(group) >= COLLAPSE_AT:
            if check.step not in done:
                done.add(check.step)
                reasons.append(collapsed(group))
            continue
        reasons.append(check.reason())
    return reasons
