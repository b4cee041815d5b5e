"""verl's own engines under test must be able to fail: a verl engine with one defect planted (a dropped
fsdp_config key; the actor loss bound to the wrong aggregation) FAILs naming it, while its clean twin — the same keys
through verl's own engine, a row of scenarios/verl.yaml — PASSes. Needs verl (the verl lane: `tox -e verl`)."""

from __future__ import annotations

import pytest

from parity.engines.verl import source
from parity.harness.config.matrix import load_file
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(source.problem() is not None, reason=f"verl lane only: {source.problem()}")]

VERL = {s.id: s for s in load_file(REPO / "scenarios" / "verl.yaml")}
TWIN = "tiny-llama/verl_fsdp/dp2/fp32/cpu+packed+settings"
#: planted engine -> the reason it must FAIL with
PLANTED = {
    "tests.data.planted_verl:DropsReshardAfterForward":
        "engine kwargs not applied as given: actor_rollout_ref.actor.fsdp_config.reshard_after_forward requested "
        "False, effective 'True, as built at verl/utils/fsdp_utils.py:",
    "tests.data.planted_verl:TokenMeanLoss":
        "engine kwargs not applied as given: actor_rollout_ref.actor.loss_agg_mode requested "
        "'seq-mean-token-mean', effective 'token-mean'",
    "tests.data.planted_verl:DropsTokenBudget":
        "engine kwargs not applied as given: actor_rollout_ref.actor.ppo_max_token_len_per_gpu requested 40, "
        "effective 'a micro-batch of",
}
#: planted engine -> checks of the numbers that must FAIL too (a read-back alone is not enough for a loss defect)
NUMBERS = {"tests.data.planted_verl:TokenMeanLoss": ("loss rel diff at step 1",
                                                    "pre-clip grad norm rel diff at step 1")}


def planted(engine: str):
    """The twin's scenario with verl's engine swapped for a planted one (every verl key the same)."""
    return VERL[TWIN].model_copy(update={"strategy": None, "engine": engine})


def test_clean_twin_passes(verl_runner):
    verdict = verl_runner.run_scenario(VERL[TWIN])
    assert verdict.status == "PASS", verdict.reasons
    applied = verdict.metrics["applied_kwargs"]["actor_rollout_ref"]
    assert applied == VERL[TWIN].actor_rollout_ref  # every key given came back as given


@pytest.mark.parametrize("engine", sorted(PLANTED))
def test_planted_verl_defect_fails_naming_it(verl_runner, engine):
    verdict = verl_runner.run_scenario(planted(engine))
    assert verdict.status == "FAIL"
    assert any(reason.startswith(PLANTED[engine]) for reason in verdict.reasons), verdict.reasons
    for metric in NUMBERS.get(engine, ()):
        assert any(reason.startswith(metric) for reason in verdict.reasons), verdict.reasons


def test_a_crash_inside_verl_is_an_error_with_verls_traceback(verl_runner):
    verdict = verl_runner.run_scenario(planted("tests.data.planted_verl:CrashesInsideVerl"))
    assert verdict.status == "ERROR", verdict.reasons
    assert "rank 1" in verdict.reasons[0] and "forward_backward_batch failed on rank 1" in verdict.reasons[0]
    assert "verl/workers/engine/base.py" in verdict.info["log_tail"]  # verl's own frames, in the rank's traceback
