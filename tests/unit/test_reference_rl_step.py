"""verl's RL step in the reference (the hf engine, in process on a tiny model): advantages from the rewards, the
step's old log-probs from its starting weights, the KL loss against the step-0 weights, ppo_epochs x mini_batches
updates each recorded, the scheduler once per step. The first update of every step has ratio 1 exactly, so its loss
is known from a plain forward: -A - entropy_coeff x H + kl_loss_coef x k3(log p, log p_step0), token-mean over the
mini-batch. A planted twin that keeps the first forward's log-probs as every step's old ones (the classic harness
step) is caught at step 2."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from parity.engines.hf import engine as hf
from parity.harness.config.models import ensure_checkpoint, model_shape
from parity.harness.contract.engine import EngineContext
from parity.harness.contract.optim_state import torch_optimizer_steps
from parity.harness.contract.schema import Scenario
from parity.harness.contract.workload import build_batch

WORKLOAD = {"batch_size": 8, "prompt_len": 8, "response_len": 8, "group_size": 4, "adv_estimator": "grpo",
            "mini_batches": 2, "ppo_epochs": 2, "steps": 2, "use_kl_loss": True, "kl_loss_coef": 0.5,
            "kl_loss_type": "k3", "clip_ratio_high": 0.28, "entropy_coeff": 0.02, "lr": 1e-3,
            "lr_scheduler_type": "cosine"}


def _engine(cache_dir: Path) -> tuple[hf.HFEngine, object]:
    scenario = Scenario(model="tiny-qwen3", strategy="hf", workload=WORKLOAD)
    checkpoint = ensure_checkpoint("tiny-qwen3", cache_dir)
    engine = hf.HFEngine(EngineContext(scenario=scenario, checkpoint=checkpoint, rank=0, world_size=1,
                                       local_rank=0, device=torch.device("cpu")))
    engine.setup()
    return engine, build_batch(scenario.workload, model_shape("tiny-qwen3").vocab_size)


def _first_update_loss(batch, logp, entropy, step0_logp, rows) -> float:
    """By hand: GRPO advantages within groups of 4, ratio 1, token-mean over the mini-batch's real tokens."""
    r = batch.rewards.reshape(-1, 4)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)
    log_r = step0_logp - logp
    per_token = -adv - 0.02 * entropy + 0.5 * (torch.exp(log_r) - 1 - log_r)
    mask = batch.response_mask[rows].double()
    return float((per_token[rows].double() * mask).sum() / mask.sum())


def _run(engine, batch):
    step0 = engine.forward(batch)
    outputs, starts = [], []
    for step in (1, 2):
        starts.append(engine.forward(batch))
        outputs.append(engine.train_step(batch, step0.logprobs, step))
    return step0, starts, outputs


@pytest.mark.parametrize("planted", [False, True], ids=["reference", "stale_old_logprobs"])
def test_rl_step_updates_old_and_ref_logprobs_and_schedule(cache_dir, monkeypatch, planted):
    if planted:  # the twin: every step trains against the first forward's log-probs
        monkeypatch.setattr(hf, "rl_step_row", lambda workload: False)
        engine, batch = _engine(cache_dir)
        engine.ref_logprobs = engine.forward(batch).logprobs  # the KL still has its reference
    else:
        engine, batch = _engine(cache_dir)
    step0, starts, outputs = _run(engine, batch)
    assert [len(out.updates) for out in outputs] == [4, 4]
    assert torch_optimizer_steps(engine.optimizer) == 8  # 2 steps x 2 epochs x 2 mini-batches
    assert [out.lr for out in outputs] == [[1e-3], [5e-4]]  # cosine over 2 steps: the scheduler moved once per step
    rows = slice(0, 4)
    want = [_first_update_loss(batch, s.logprobs, s.entropy, step0.logprobs, rows) for s in starts]
    got = [out.updates[0][0] for out in outputs]
    assert math.isclose(got[0], want[0], rel_tol=1e-5, abs_tol=1e-7)  # step 1: both sides start from step 0
    assert math.isclose(got[1], want[1], rel_tol=1e-5, abs_tol=1e-7) is not planted
    # the updates are distinct optimizer steps: the second mini-batch's loss is not the first's
    assert len({u[0] for u in outputs[1].updates}) == 4
