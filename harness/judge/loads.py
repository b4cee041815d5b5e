"""MoE load statistics: how many tokens each expert of each layer received, as the router's load-balancing
statistics count them (StepOutput.expert_load), against the reference's, at every step. Opt-in per scenario
(`tolerance.expert_load_abs`): the count of tokens is what an aux loss or an expert-bias update balances, and a
padding token counted there (packed streams pad every sequence; left-padded rows pad prompts) skews it while
every log-prob and gradient of the real tokens stays right.
"""

from __future__ import annotations

from parity.harness.contract.grad_groups import describe
from parity.harness.judge.checks import Check
from parity.harness.judge.tolerances import Limits
from parity.harness.run.records import RunRecord


def expert_load_checks(candidate: RunRecord, reference: RunRecord, limits: Limits) -> list[Check]:
    """Per step and layer, the largest |Δ| in tokens over its experts (each layer's check, failing or not, so the
    report shows the margin). A candidate that reports no loads where the scenario asks for them FAILs."""
    limit = limits.expert_load_abs
    if limit is None:
        return []
    checks: list[Check] = []
    for cand, ref in zip(candidate.steps, reference.steps, strict=False):
        if ref.expert_load is None:
            checks.append(Check("expert load", float("inf"), limit, step=cand.step,
                                note="the reference reports none (not a MoE model?)"))
            continue
        if cand.expert_load is None:
            checks.append(Check("expert load", float("inf"), limit, step=cand.step,
                                note="the candidate reports none"))
            continue
        for layer in sorted(set(ref.expert_load) | set(cand.expert_load)):
            r, c = ref.expert_load.get(layer), cand.expert_load.get(layer)
            label = f"{describe(layer)} expert load max |Δ| (tokens)"
            if r is None or c is None or len(r) != len(c):
                checks.append(Check(label, float("inf"), limit, step=cand.step,
                                    note=f"candidate {c} vs reference {r}"))
                continue
            diffs = [abs(a - b) for a, b in zip(c, r, strict=True)]
            worst = max(range(len(diffs)), key=diffs.__getitem__)
            checks.append(Check(label, diffs[worst], limit, step=cand.step,
                                note=f"expert {worst}: {c[worst]:g} vs {r[worst]:g}; totals {sum(c):g} vs {sum(r):g}"))
    return checks
