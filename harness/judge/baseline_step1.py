"""Step 1 against the same-recipe baseline (the three-way lane): the candidate's pre-clip grad norm, and each
module's, against the baseline's. Both start from the same weights and run the same recipe in the same dtype, so
before any update the two gradients differ by two implementations' rounding alone: a small gradient scale (1 %) or
one module's gradient scaled (x1.5) stands out there, where against the fp32 reference the dtype's own gap hides it.
After step 1 the two runs' weights have drifted apart by their updates, so later steps are judged by the ratio
checks instead."""

from __future__ import annotations

import math
import statistics

from parity.harness.contract.grad_groups import describe
from parity.harness.judge.checks import Check, failing_or_worst
from parity.harness.judge.compare import rel_diff, rel_limit
from parity.harness.judge.tolerances import Limits
from parity.harness.run.records import RunRecord

#: fewest modules whose median ratio is a scale they share: with fewer, one module's own rounding is the median
COMMON_SCALE_MIN_MODULES = 8


def common_grad_scale(candidate: dict[str, float], baseline: dict[str, float]) -> float | None:
    """The scale every module's step-1 gradient shares against the baseline's: the median over modules of
    candidate / baseline grad norm, minus 1. A loss or gradient normalised a percent off moves every module by that
    percent; rounding and a MoE router's bf16 top-k flips move some modules each way, by a few percent each, which
    the whole gradient's norm sums into a spread as wide as the scale (the MoE class) and the median passes over.
    None with fewer than COMMON_SCALE_MIN_MODULES modules in both."""
    ratios = [candidate[name] / baseline[name] for name in baseline.keys() & candidate.keys() if baseline[name] > 0]
    return statistics.median(ratios) - 1 if len(ratios) >= COMMON_SCALE_MIN_MODULES else None


#: the loss check's absolute floor: a step-1 loss can cancel to near zero (a sum of +-advantage terms), and two
#: fp32 sums of the same bf16 terms differ by about this much (an fp32 unit roundoff on an O(1) loss term)
LOSS_ATOL = 1e-6


def baseline_step1_checks(candidate: RunRecord, baseline: RunRecord, limits: Limits) -> list[Check]:
    """The loss and grad-norm checks, and the failing module checks (else the worst passing one, to show the
    margin)."""
    if not candidate.steps or not baseline.steps:
        return []
    cand, base = candidate.steps[0], baseline.steps[0]
    checks = []
    if (limit := limits.loss_rel_baseline_step1) is not None:
        checks.append(Check("loss rel diff to the baseline", rel_diff(cand.loss, base.loss),
                            rel_limit(limit, LOSS_ATOL, base.loss), step=1, lane="baseline",
                            note=f"baseline {base.loss:.6g}; rtol {limit:.3g} + atol {LOSS_ATOL:.3g}/|baseline|"))
    if (limit := limits.grad_norm_rel_baseline_step1) is not None:
        checks.append(Check("pre-clip grad norm rel diff to the baseline", rel_diff(cand.grad_norm, base.grad_norm),
                            limit, step=1, lane="baseline", note=f"baseline {base.grad_norm:.6g}"))
    if cand.group_grad_norms is None or base.group_grad_norms is None:
        return checks
    if (limit := limits.common_grad_scale_baseline_step1) is not None and (
            scale := common_grad_scale(cand.group_grad_norms, base.group_grad_norms)) is not None:
        checks.append(Check("median module grad norm ratio to the baseline, minus 1", abs(scale), limit, step=1,
                            lane="baseline", note=f"signed {scale:+.3g}: a scale every module shares"))
    if (limit := limits.group_grad_norm_rel_baseline_step1) is None:
        return checks
    modules = []
    for group in sorted(set(base.group_grad_norms) | set(cand.group_grad_norms)):
        c, b = cand.group_grad_norms.get(group, math.nan), base.group_grad_norms.get(group, math.nan)
        modules.append(Check(f"{describe(group)} grad norm rel diff to the baseline", rel_diff(c, b), limit, step=1,
                             lane="baseline", note=f"baseline {b:.6g}"))
    return checks + failing_or_worst(modules)
