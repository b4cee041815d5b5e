"""verl's RL step as verl's worker and trainer run it (engines/verl/engine.py), planted in verl's worker and trainer:
each defect FAILs naming the metric and, where a read-back sees it, the key; the clean twin PASSes. The twin is the
RL-step row of scenarios/verl.yaml (nightly: an RL row costs a minute or two on 2 cores, beyond .ci/run's budget;
the nightly's verl job runs this file). Needs verl (the verl lane)."""

from __future__ import annotations

import pytest

from parity.engines.verl import source
from parity.harness.config.matrix import load_file
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(source.problem() is not None, reason=f"verl lane only: {source.problem()}")]

VERL = {s.id: s for s in load_file(REPO / "scenarios" / "verl.yaml")}


RL_TWIN = "tiny-qwen3/verl_fsdp/dp2/fp32/cpu+packed+rlstep-grpo"


def _reference_runs_the_rl_step() -> bool:
    from parity.engines.specs import HF

    return bool(HF.rl_step)


needs_rl_reference = pytest.mark.skipif(not _reference_runs_the_rl_step(),
                                        reason="the HF reference does not implement verl's RL step yet (hf spec "
                                               "rl_step is empty): the numbers have nothing to be judged against")


def rl_planted(engine: str):
    return VERL[RL_TWIN].model_copy(update={"strategy": None, "engine": engine})


def test_the_scheduler_stepped_per_mini_batch_fails_on_the_lr_read_back(verl_runner):
    """Seen without the reference: the lr every update ran at is not the step's (the scheduler stepped per update)."""
    verdict = verl_runner.run_scenario(rl_planted("tests.data.planted_verl:SchedulerPerMiniBatch"))
    assert verdict.status == "FAIL"
    assert any(reason.startswith("engine kwargs not applied as given: actor_rollout_ref.actor.optim.lr") and
               "step 1 update 2" in reason for reason in verdict.reasons), verdict.reasons


@needs_rl_reference
def test_the_rl_twin_passes_with_every_key_read_back(verl_runner):
    verdict = verl_runner.run_scenario(rl_planted("tests.data.planted_verl:CleanWorkerTwin"))
    assert verdict.status == "PASS", verdict.reasons
    assert verdict.metrics["applied_kwargs"]["actor_rollout_ref"] == VERL[RL_TWIN].actor_rollout_ref


@needs_rl_reference
@pytest.mark.parametrize("engine", ["AdvantagesOverTheBatch", "KLSignFlipped", "ClipHighIgnored",
                                    "SchedulerPerMiniBatch"])
def test_a_planted_rl_step_defect_fails_on_the_loss(verl_runner, engine):
    verdict = verl_runner.run_scenario(rl_planted(f"tests.data.planted_verl:{engine}"))
    assert verdict.status == "FAIL"
    assert any(reason.startswith("loss rel diff") for reason in verdict.reasons), verdict.reasons
