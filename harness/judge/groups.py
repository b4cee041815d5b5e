"""Per-module gradient fingerprint check: each parameter group's pre-clip grad norm against the reference's, at
every step, so a FAIL says WHERE the gradient went wrong (`layer 2 self_attn.q_norm grad norm rel diff at step 1`).

`|c - r| <= atol * G + rtol * |r|` with G the reference's global grad norm at that step: the absolute floor is
tied to the whole gradient, so a group with almost none does not turn rounding into a FAIL. A candidate that
reports no groups (a third-party engine) is not compared; one that reports some must report the reference's.
"""

from __future__ import annotations

import math

from parity.harness.contract.grad_groups import describe
from parity.harness.judge.checks import Check, failing_or_worst
from parity.harness.judge.compare import rel_diff
from parity.harness.judge.tolerances import Limits
from parity.harness.run.records import RunRecord


def group_checks(candidate: RunRecord, reference: RunRecord, limits: Limits) -> tuple[list[Check], float | None]:
    """The failing group checks of every step, plus the worst passing one per step (so the report shows the
    margin); and the worst relative difference over all groups and steps (None when not compared)."""
    if limits.group_grad_norm_rel is None:
        return [], None
    checks: list[Check] = []
    observed_all: list[float] = []
    for cand, ref in zip(candidate.steps, reference.steps, strict=False):
        if cand.group_grad_norms is None or ref.group_grad_norms is None:
            continue
        rtol = limits.group_rtol(cand.step)
        atol = limits.group_grad_norm_atol * abs(ref.grad_norm) if math.isfinite(ref.grad_norm) else 0.0
        step_checks = []
        for group in sorted(set(ref.group_grad_norms) | set(cand.group_grad_norms)):
            r, c = ref.group_grad_norms.get(group), cand.group_grad_norms.get(group)
            label = f"{describe(group)} grad norm rel diff"
            if r is None or c is None:
                missing = "the candidate" if c is None else "the reference"
                step_checks.append(Check(label, math.inf, 0.0, step=cand.step, lane="rel",
                                         note=f"group not reported by {missing}"))
                continue
            observed = rel_diff(c, r)
            limit = rtol + atol / max(abs(r), 1e-12)
            step_checks.append(Check(label, observed, limit, step=cand.step, lane="rel",
                                     note=f"rtol {rtol:.3g} + {limits.group_grad_norm_atol:.3g} x global norm "
                                          f"{ref.grad_norm:.3g} / |ref {r:.3g}|"))
            observed_all.append(observed)
        checks += failing_or_worst(step_checks)
    worst = max(observed_all, key=lambda v: math.inf if math.isnan(v) else v) if observed_all else None
    return checks, worst


def worst_group_rel_per_step(candidate: RunRecord, reference: RunRecord) -> list[float | None]:
    """Per step, the largest relative difference of any group (None where a side reports none): what a long run's
    band for the groups is calibrated on."""
    worst: list[float | None] = []
    for cand, ref in zip(candidate.steps, reference.steps, strict=False):
        if cand.group_grad_norms is None or ref.group_grad_norms is None:
            worst.append(None)
            continue
        rels = [rel_diff(cand.group_grad_norms.get(g, math.nan), r) for g, r in ref.group_grad_norms.items()]
        worst.append(max(rels, key=lambda v: math.inf if math.isnan(v) else v) if rels else None)
    return worst


def group_sum_checks(candidate: RunRecord, limits: Limits) -> list[Check]:
    """The candidate against itself, every step: its pre-clip global grad norm (what it clips with) against the
    root-sum-square of its own modules' grad norms (harness/contract/grad_groups.py: the groups partition the
    parameters). Both are read from the same gradients, so they differ by summation order alone; a norm that misses
    a shard (an expert-parallel rank's experts taken for a tensor-parallel copy), or counts one twice, clips every
    update wrongly while each module's gradient is right. The failing steps, else the worst passing one."""
    if limits.group_sum_rel is None:
        return []
    checks = [Check("pre-clip grad norm rel diff to its modules' root-sum-square", rel_diff(step.grad_norm, total),
                    limits.group_sum_rel, step=step.step, lane="self", update=step.update if step.update > 1 else None,
                    note=f"modules {total:.6g}, engine {step.grad_norm:.6g}")
              for step in candidate.steps if step.group_grad_norms
              for total in [math.sqrt(sum(v * v for v in step.group_grad_norms.values()))]]
    return failing_or_worst(checks)
