"""The judge's checks of the schedule, of a resumed run against its uninterrupted twin and of a converted checkpoint,
on synthetic records: each must pass its clean twin and FAIL a planted difference, naming the step."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from parity.harness.contract.schedule import lr_at
from parity.harness.contract.schema import Tolerance, Workload
from parity.harness.judge.checkpoint import conversion_checks, resume_checks
from parity.harness.judge.schedule import lr_checks
from parity.harness.judge.tolerances import limits_for
from parity.harness.run.records import RunRecord, StepRecord

WORKLOAD = Workload(steps=4, lr=1e-3, lr_warmup_steps=2, lr_scheduler_type="cosine", min_lr_ratio=0.1)
LIMITS = limits_for("fp32", Tolerance())


def _record(lrs=None, losses=(0.5, 0.4, 0.3, 0.2), shift: float = 0.0) -> RunRecord:
    lrs = lrs or [lr_at(WORKLOAD, k) for k in range(1, 5)]
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(2, 3, generator=gen)
    entropy = torch.rand(2, 3, generator=gen)
    tensors = {"response_mask": torch.ones(2, 3), "logprobs_before": logprobs, "entropy_before": entropy,
               "logprobs_after": logprobs + shift, "entropy_after": entropy}
    steps = [StepRecord(step=k, loss=loss, grad_norm=1.0 + k, step_time_s=0.1, lr=[lr, lr])
             for k, (loss, lr) in enumerate(zip(losses, lrs, strict=True), start=1)]
    return RunRecord(run_id="r", scenario_hash="h", status="ok", steps=steps, tensors=tensors)


def _failing(checks):
    return [c.reason() for c in checks if not c.passed]


def test_a_schedule_followed_passes_and_a_warmup_ignored_fails_at_step_1():
    assert _failing(lr_checks(_record(), WORKLOAD, LIMITS)) == []
    ignored = [WORKLOAD.lr, *(lr_at(WORKLOAD, k) for k in range(2, 5))]
    reasons = _failing(lr_checks(_record(lrs=ignored), WORKLOAD, LIMITS))
    assert reasons[0].startswith("learning rate vs the schedule at step 1 = 1 > limit 1e-06"), reasons
    assert "engine 0.001 in param group 0 of 2, schedule 0 (lr 0.001, warmup 2, cosine" in reasons[0]


def test_one_param_group_off_the_schedule_is_named():
    record = _record()
    record.steps[2].lr = [record.steps[2].lr[0], 0.0]
    reasons = _failing(lr_checks(record, WORKLOAD, LIMITS))
    assert len(reasons) == 1 and "at step 3" in reasons[0] and "param group 1 of 2" in reasons[0]


def test_an_engine_that_reports_no_lr_is_not_compared():
    record = _record()
    for step in record.steps:
        step.lr = None
    assert lr_checks(record, WORKLOAD, LIMITS) == []


def test_a_resume_is_judged_bit_for_bit_on_the_same_layout():
    uninterrupted = _record()
    assert _failing(resume_checks(_record(), uninterrupted, LIMITS, exact=True, first_resumed_step=3)) == []
    off = _record(losses=(0.5, 0.4, 0.3, math.nextafter(0.2, 1.0)))
    reasons = _failing(resume_checks(off, uninterrupted, LIMITS, exact=True, first_resumed_step=3))
    assert reasons and reasons[0].startswith("resume: loss |Δ| to the uninterrupted run at step 4 = 2.78e-17 > "
                                             "limit 0"), reasons


def test_a_resume_onto_another_layout_takes_the_scenarios_limits():
    uninterrupted = _record()
    near = _record(losses=(0.5, 0.4, 0.3, 0.2 + 1e-9), shift=1e-6)
    assert _failing(resume_checks(near, uninterrupted, LIMITS, exact=False, first_resumed_step=3)) == []
    far = _record(shift=1e-3)
    reasons = _failing(resume_checks(far, uninterrupted, LIMITS, exact=False, first_resumed_step=3))
    assert reasons == ["resume: log-prob after the last step max |Δ| to the uninterrupted run = 0.001 > limit 5e-05 "
                       "(abs; another layout: the scenario's limits)"]


def test_steps_before_the_checkpoint_are_not_the_resumes_to_judge():
    before = _record(losses=(0.9, 0.4, 0.3, 0.2))
    assert _failing(resume_checks(before, _record(), LIMITS, exact=True, first_resumed_step=3)) == []


def test_conversion_checks_compare_the_converted_checkpoint_with_the_engine():
    record = _record()
    record.tensors |= {"logprobs_converted": record.tensors["logprobs_after"].clone(),
                       "entropy_converted": record.tensors["entropy_after"].clone()}
    assert _failing(conversion_checks(record, LIMITS)) == []
    wrong = replace(record, tensors={**record.tensors, "logprobs_converted": record.tensors["logprobs_after"] + 0.5})
    reasons = _failing(conversion_checks(wrong, LIMITS))
    assert reasons[0].startswith("converted HF checkpoint (saved after the step) vs the engine: log-prob max |Δ| at "
                                 "step 4 = 0.5 > limit 5e-05"), reasons
    missing = replace(record, tensors={k: v for k, v in record.tensors.items() if "converted" not in k})
    assert _failing(conversion_checks(missing, LIMITS)), "no converted log-probs must not pass"


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_resumed_loss_never_passes(value):
    bad = _record(losses=(0.5, 0.4, value, 0.2))
    assert _failing(resume_checks(bad, _record(), LIMITS, exact=False, first_resumed_step=3))
