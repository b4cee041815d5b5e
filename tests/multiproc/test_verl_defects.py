"""verl defects a row hits on the verl that runs here (engines/verl/defects.py), their marks lifted: such a row is
broken on this stack only, and with the mark lifted it FAILs on the read-back the defect breaks. On verl's main
branch (1dda039b9) the RL rows' token budget is overfilled by verl's balanced partition; verl 0.9.1 fits them, so
there these tests have nothing to lift. When verl fixes the function, the mark goes by itself (the rule runs verl's
own partition). The nightly's verl job runs this file on both (`verl` and `verl-main`)."""

from __future__ import annotations

import pytest

from parity.engines.verl import defects, source
from parity.harness.config.matrix import load_file
from parity.harness.config.models import model_shape
from parity.harness.config.validate import skip_reason
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.nightly,
              pytest.mark.skipif(source.problem() is not None, reason=f"verl lane only: {source.problem()}")]

BUDGETED = [s for s in load_file(REPO / "scenarios" / "verl.yaml")
            if s.actor_rollout_ref.get("actor.use_dynamic_bsz") and not s.broken]


@pytest.mark.parametrize("row", BUDGETED, ids=[s.id for s in BUDGETED])
def test_a_row_broken_by_verls_partition_fails_on_the_budget_read_back_once_lifted(verl_runner, monkeypatch, row):
    defect = defects.token_budget_partition(row, model_shape(row.model))
    if defect is None:
        pytest.skip(f"verl {source.version()}'s partition keeps this row's micro-batches within the budget")
    assert skip_reason(row) == f"marked broken on this stack: {defect}"
    monkeypatch.setattr(defects, "token_budget_partition", lambda scenario, shape: None)
    verdict = verl_runner.run_scenario(row)
    assert verdict.status == "FAIL", verdict.reasons
    assert any("actor_rollout_ref.actor.ppo_max_token_len_per_gpu" in r and "verl did not split them" in r
               for r in verdict.reasons), verdict.reasons
