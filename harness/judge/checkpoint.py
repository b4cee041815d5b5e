"""Checks of a run that went through the engine's own checkpoint.

Resume parity: a run trained k steps, saved, and continued in fresh processes from the checkpoint (possibly on
another layout) against the same engine's uninterrupted run, step by step (loss, pre-clip grad norm, learning rate)
and after the last step (log-probs, entropy). On the same layout the continuation is the same program from the same
state, so it must be bit-identical (limit 0): a moment, a step count or a scheduler state not restored exactly
shows at the first step that uses it. On another layout (tp2 -> pp2 through dist-ckpt's resharding) the numbers
differ by the layouts' rounding, and the scenario's own limits apply.

Conversion parity: the engine's checkpoint converted to HF (the engine's converter) and scored by plain
transformers must give the engine's own after-training log-probs, within the scenario's log-prob limits.
"""

from __future__ import annotations

import math

from parity.harness.judge.checks import Check
from parity.harness.judge.compare import token_diff
from parity.harness.judge.tolerances import Limits
from parity.harness.run.records import RunRecord

RESUME = "resume: "
CONVERSION = "converted HF checkpoint (saved after the step) vs the engine: "


def _abs(a: float, b: float) -> float:
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf


def resume_checks(resumed: RunRecord, uninterrupted: RunRecord, limits: Limits, exact: bool,
                  first_resumed_step: int) -> list[Check]:
    """Every step from the first resumed one, and the after-training forward, against the uninterrupted run."""
    checks: list[Check] = []
    how = "bit-identical expected: same layout" if exact else "another layout: the scenario's limits"
    by_update = {(s.step, s.update): s for s in uninterrupted.steps}
    for step in resumed.steps:
        if step.step < first_resumed_step:
            continue
        base = by_update.get((step.step, step.update))
        if base is None:
            checks.append(Check(f"{RESUME}step missing from the uninterrupted run", math.inf, 0.0, step=step.step))
            continue
        for name, label in (("loss", "loss"), ("grad_norm", "pre-clip grad norm")):
            ours, theirs = getattr(step, name), getattr(base, name)
            if exact:
                checks.append(Check(f"{RESUME}{label} |Δ| to the uninterrupted run", _abs(ours, theirs), 0.0,
                                    step=step.step, note=f"{ours!r} vs {theirs!r}; {how}"))
            else:
                rtol, atol = limits.step_tolerance(name, step.step)
                limit = atol + rtol * abs(theirs) if math.isfinite(theirs) else 0.0
                checks.append(Check(f"{RESUME}{label} |Δ| to the uninterrupted run", _abs(ours, theirs), limit,
                                    step=step.step, note=f"{ours:.8g} vs {theirs:.8g}; {how}"))
        if step.lr and base.lr:
            worst = max(_abs(a, b) for a, b in zip(step.lr, base.lr, strict=False))
            checks.append(Check(f"{RESUME}learning rate |Δ| to the uninterrupted run", worst,
                                0.0 if exact else limits.lr_rel * max(base.lr), step=step.step,
                                note=f"{step.lr} vs {base.lr}"))
    mask = uninterrupted.tensors["response_mask"]
    for key, label in (("logprobs_after", "log-prob after the last step"),
                       ("entropy_after", "entropy after the last step")):
        diff = token_diff(resumed.tensors[key], uninterrupted.tensors[key], mask)
        limit = 0.0 if exact else limits.token_limit("logprob_max_abs", updated=True)
        checks.append(Check(f"{RESUME}{label} max |Δ| to the uninterrupted run", diff.max_abs, limit, note=how))
    return checks


def conversion_checks(record: RunRecord, limits: Limits) -> list[Check]:
    """The converted checkpoint's log-probs and entropy against the engine's own after the last step."""
    mask = record.tensors["response_mask"]
    if "logprobs_converted" not in record.tensors:
        return [Check(f"{CONVERSION}no log-probs of a converted checkpoint in the record", math.inf, 0.0)]
    step = record.steps[-1].step if record.steps else None  # the checkpoint was saved after it
    diff = token_diff(record.tensors["logprobs_converted"], record.tensors["logprobs_after"], mask)
    entropy = token_diff(record.tensors["entropy_converted"], record.tensors["entropy_after"], mask)
    def limit(name: str) -> float:  # the checkpoint was saved after the updates
        return limits.token_limit(name, updated=True)

    return [Check(f"{CONVERSION}log-prob max |Δ|", diff.max_abs, limit("logprob_max_abs"), step=step),
            Check(f"{CONVERSION}log-prob mean |Δ|", diff.mean_abs, limit("logprob_mean_abs"), step=step),
            Check(f"{CONVERSION}log-prob p99 |Δ|", diff.p99_abs, limit("logprob_p99_abs"), step=step),
            Check(f"{CONVERSION}log-prob KL k3", diff.kl_k3, limit("kl_k3"), step=step),
            Check(f"{CONVERSION}entropy max |Δ|", entropy.max_abs, limit("logprob_max_abs"), step=step)]
