"""rollout/metrics.py restates verl's rollout/actor figures (the vLLM lane cannot import verl): here, in verl's
venv, verl's own functions run on the same tensors and must give the same numbers; a verl that changes a formula
FAILs this test. Planted: a restatement that reads log-probs where verl reads probabilities must differ."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed: run in verl's venv (ci/constraints-verl.txt)")

from parity.rollout.metrics import IS_THRESHOLD, importance_ratio, probs_diff


def _tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    rollout = -torch.rand(4, 9, generator=gen, dtype=torch.float64) * 3
    actor = rollout + 0.3 * torch.randn(4, 9, generator=gen, dtype=torch.float64)
    actor[0, 1] += 1.5  # one ratio past the TIS threshold
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[1, 6:] = 0
    mask[3, 4:] = 0
    return rollout, actor, mask


def test_probs_diff_is_verls_calculate_debug_metrics() -> None:
    from verl.protocol import DataProto
    from verl.utils.debug.metrics import calculate_debug_metrics

    rollout, actor, mask = _tensors()
    data = DataProto.from_dict({"rollout_log_probs": rollout, "old_log_probs": actor, "response_mask": mask,
                                "responses": torch.zeros_like(mask)})
    theirs = calculate_debug_metrics(data)
    ours = probs_diff(rollout, actor, mask)
    for key, value in ours.items():
        assert value == pytest.approx(theirs[key], rel=1e-9, abs=1e-12), key
    planted = probs_diff(rollout.exp(), actor.exp(), mask)  # log-probs where verl takes probabilities
    assert planted["training/rollout_probs_diff_max"] != pytest.approx(theirs["training/rollout_probs_diff_max"])


def test_importance_ratio_is_verls_token_tis() -> None:
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics, compute_rollout_correction_weights

    rollout, actor, mask = _tensors()
    _, theirs = compute_rollout_correction_weights(actor - rollout, mask, rollout_is="token",
                                                   rollout_is_threshold=IS_THRESHOLD)
    theirs |= compute_offpolicy_metrics(actor, rollout, mask)
    ours = importance_ratio(rollout, actor, mask)
    assert ours["rollout_is_ratio_fraction_high"] > 0
    for key, value in ours.items():
        assert value == pytest.approx(theirs[key], rel=1e-6, abs=1e-9), key
