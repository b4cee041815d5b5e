"""The reference's RL-step math (parity.reference.losses, written from the papers and verl's documented settings,
importing nothing of verl) cross-checked against a third source: verl's own functions (verl/trainer/ppo/core_algos.py)
called on the same tensors. Each estimator, policy-loss mode and KL estimator must give the same loss and the same
gradient; a reference constant planted back to a wrong value (kl_cov's ppo_kl_coef at 1.0, the fallback of verl's
function rather than its config default 0.1 — the reference had it so) must be caught. Needs verl (the verl lane)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl", reason="the verl lane (ci/verl-lane.txt): verl's functions are the third source")

from parity.reference import losses as ref  # noqa: E402

ROWS, POSITIONS, GROUP = 8, 16, 4
#: away from every default (clip-higher, a dual clip), as the RL rows are
CLIP = SimpleNamespace(clip_low=0.2, clip_high=0.28, clip_ratio_c=2.5)


@pytest.fixture
def batch():
    generator = torch.Generator().manual_seed(11)
    mask = torch.ones(ROWS, POSITIONS)
    for row, length in enumerate((16, 12, 9, 16, 14, 5, 16, 11)):
        mask[row, length:] = 0
    old = torch.randn(ROWS, POSITIONS, generator=generator) * 0.5 - 2.0
    # ratios well away from 1 (some beyond the clip range, both sides), as from the second update on
    logp = old + torch.randn(ROWS, POSITIONS, generator=generator) * 0.3
    rewards = torch.randn(ROWS, generator=generator)
    ref_logp = old + torch.randn(ROWS, POSITIONS, generator=generator) * 0.2
    return SimpleNamespace(mask=mask, old=old, logp=logp, rewards=rewards, ref_logp=ref_logp,
                           token_rewards=ref.outcome_token_rewards(rewards, mask))


def _verl_advantages(estimator: str, batch) -> torch.Tensor:
    import numpy as np
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos

    index = np.array([row // GROUP for row in range(ROWS)])
    if estimator == "grpo":
        return core_algos.compute_grpo_outcome_advantage(batch.token_rewards, batch.mask, index)[0]
    if estimator == "rloo":
        return core_algos.compute_rloo_outcome_advantage(batch.token_rewards, batch.mask, index)[0]
    return core_algos.compute_reinforce_plus_plus_outcome_advantage(batch.token_rewards, batch.mask,
                                                                   config=AlgoConfig(gamma=1.0))[0]


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus"])
def test_advantages_are_verls(batch, estimator):
    mine = ref.advantages(estimator, batch.rewards, batch.mask, GROUP)
    torch.testing.assert_close(mine, _verl_advantages(estimator, batch), rtol=1e-6, atol=1e-6)


def _losses(mode: str, batch, seed: int = 5) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    """(reference loss, its gradient), (verl's loss, its gradient) for one policy-loss mode on the same tensors;
    clip_cov draws its random subset from torch's global generator on both sides, seeded alike."""
    from verl.trainer.ppo import core_algos
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    adv = ref.advantages("grpo", batch.rewards, batch.mask, GROUP)
    workload = SimpleNamespace(policy_loss=mode, loss_agg_mode="token-mean", **vars(CLIP))
    config = ActorConfig(strategy="fsdp", ppo_mini_batch_size=ROWS, ppo_micro_batch_size_per_gpu=ROWS, rollout_n=1,
                         clip_ratio_low=CLIP.clip_low, clip_ratio_high=CLIP.clip_high, clip_ratio_c=CLIP.clip_ratio_c,
                         policy_loss=PolicyLossConfig(loss_mode=mode))
    out = []
    for side in ("reference", "verl"):
        logp = batch.logp.clone().requires_grad_(True)
        torch.manual_seed(seed)
        if side == "reference":
            per_token, agg = ref.policy_losses(workload, logp, batch.old, adv, batch.mask)
            loss = ref.aggregate(agg, per_token, batch.mask, float(batch.mask.sum()), float(ROWS))
        else:
            agg = "seq-mean-token-mean" if mode == "gspo" else "token-mean"
            loss, _ = core_algos.get_policy_loss_fn(mode)(batch.old, logp, adv, batch.mask, agg, config)
        out.append((loss.detach(), torch.autograd.grad(loss, logp)[0]))
    return out[0], out[1]


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "clip_cov", "kl_cov"])
def test_each_policy_loss_is_verls_in_value_and_gradient(batch, mode):
    (loss, grad), (verl_loss, verl_grad) = _losses(mode, batch)
    torch.testing.assert_close(loss, verl_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, verl_grad, rtol=1e-6, atol=1e-7)


def test_a_wrong_kl_cov_coefficient_is_caught(batch, monkeypatch):
    monkeypatch.setattr(ref, "PPO_KL_COEF", 1.0)
    (loss, grad), (verl_loss, verl_grad) = _losses("kl_cov", batch)
    assert not torch.allclose(loss, verl_loss, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(grad, verl_grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3"])
def test_each_kl_estimator_is_verls(batch, kind):
    from verl.trainer.ppo import core_algos

    torch.testing.assert_close(ref.kl_estimate(batch.logp, batch.ref_logp, kind),
                               core_algos.kl_penalty_forward(batch.logp, batch.ref_logp, kind), rtol=1e-6, atol=1e-7)
