"""A step of several optimizer updates (Workload.updates_per_step = mini_batches x ppo_epochs) is recorded and judged
per update: the worker takes StepOutput.updates (refusing a count other than the workload's), the judge compares
every update's loss and pre-clip grad norm element-wise and names "step s, update u", the optimizer's own step count
is held to steps x updates, and a resumed run meets its uninterrupted twin update by update. Each with a planted
defect and its clean twin."""

from __future__ import annotations

import pytest
import torch

from parity.harness.contract.engine import StepOutput
from parity.harness.contract.schema import Scenario, Tolerance
from parity.harness.judge.checkpoint import resume_checks
from parity.harness.judge.tolerances import limits_for
from parity.harness.judge.verdict import judge
from parity.harness.run.records import RunRecord, StepRecord
from parity.harness.run.worker import EngineOutputError, checked_updates

SCENARIO = Scenario(model="tiny-qwen3", strategy="hf", workload={"steps": 2, "mini_batches": 2})
LOSSES = {(1, 1): 0.5, (1, 2): 0.45, (2, 1): 0.4, (2, 2): 0.35}


def _record(losses=LOSSES, optimizer_steps=4) -> RunRecord:
    logp = -torch.arange(1.0, 9.0).reshape(2, 4) / 4
    tensors = {"logprobs_before": logp, "logprobs_after": logp - 0.01, "entropy_before": -logp,
               "entropy_after": -logp + 0.01, "response_mask": torch.ones(2, 4, dtype=torch.long)}
    steps = [StepRecord(step=s, update=u, loss=loss, grad_norm=2.0 + loss, step_time_s=0.1)
             for (s, u), loss in losses.items()]
    return RunRecord(run_id="x", scenario_hash="h", status="ok", steps=steps, tensors=tensors,
                     optimizer_steps=optimizer_steps)


def test_every_update_is_judged_and_a_wrong_one_is_named_by_step_and_update():
    assert judge(SCENARIO, _record(), _record()).status == "PASS"
    verdict = judge(SCENARIO, _record({**LOSSES, (2, 1): 0.41}), _record())
    assert verdict.status == "FAIL"
    assert [r for r in verdict.reasons if r.startswith("loss rel diff")] == [
        "loss rel diff at step 2, update 1 = 0.025 > limit 2.25e-05 (rel; rtol 2e-05 + atol 1e-06/|ref 0.4|)"]


def test_a_missing_update_fails_where_it_is_missing():
    short = {k: v for k, v in LOSSES.items() if k != (2, 2)}
    verdict = judge(SCENARIO, _record(short, optimizer_steps=3), _record())
    assert any(r.startswith("loss rel diff at step 2, update 2 = inf") for r in verdict.reasons)


def test_the_optimizer_step_count_is_steps_times_updates():
    assert not [r for r in judge(SCENARIO, _record(), _record()).reasons if "optimizer took" in r]
    verdict = judge(SCENARIO, _record(optimizer_steps=2), _record())  # one update per step: mini-batches ignored
    assert "optimizer took 2 steps, workload has 4 (2 per step) (Engine.optimizer_steps read back from the " \
           "optimizer state)" in verdict.reasons


def test_the_worker_takes_each_update_and_refuses_another_count():
    out = StepOutput(loss=0.3, grad_norm=1.0, updates=[(0.5, 2.0), (torch.tensor(0.25), 1.0)])
    assert checked_updates(out, 1, 2) == [(0.5, 2.0), (0.25, 1.0)]
    assert checked_updates(StepOutput(loss=0.3, grad_norm=1.0), 1, 1) == [(0.3, 1.0)]
    with pytest.raises(EngineOutputError, match=r"StepOutput.updates is None, but the workload takes 2"):
        checked_updates(StepOutput(loss=0.3, grad_norm=1.0), 1, 2)
    with pytest.raises(EngineOutputError, match=r"expected a list of 4 \(loss, grad_norm\) pairs"):
        checked_updates(out, 1, 4)
    with pytest.raises(EngineOutputError, match="update 2 is"):
        checked_updates(StepOutput(loss=0.3, grad_norm=1.0, updates=[(0.5, 2.0), ("x", 1.0)]), 1, 2)


def test_a_resumed_run_meets_its_uninterrupted_twin_update_by_update():
    limits = limits_for("fp32", Tolerance())
    assert not [c for c in resume_checks(_record(), _record(), limits, True, 2) if not c.passed]
    # the resumed run's two updates of step 2 swapped: each compared with its own update, both FAIL
    swapped = _record({**LOSSES, (2, 1): LOSSES[(2, 2)], (2, 2): LOSSES[(2, 1)]})
    failing = [c for c in resume_checks(swapped, _record(), limits, True, 2) if not c.passed]
    assert len([c for c in failing if c.metric.endswith("loss |Δ| to the uninterrupted run")]) == 2
