"""The shared batch and loss: deterministic, padded the way verl pads, and normalised by global tokens."""

from __future__ import annotations

import torch

from parity.harness.contract.losses import logprobs_and_entropy, masked_loss_sum
from parity.harness.contract.schema import Workload
from parity.harness.contract.workload import build_batch, shift_masks


def test_batch_is_deterministic_and_padded_like_verl():
    workload = Workload(batch_size=8, prompt_len=6, response_len=5, seed=3)
    a, b = build_batch(workload, 100), build_batch(workload, 100)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.advantages, b.advantages)
    assert not torch.equal(a.input_ids, build_batch(Workload(batch_size=8, prompt_len=6, response_len=5, seed=4),
                                                    100).input_ids)
    prompt, response = a.attention_mask[:, :6], a.attention_mask[:, 6:]
    assert torch.equal(prompt, prompt.sort(dim=1).values)  # left padding: zeros first
    assert torch.equal(response, response.sort(dim=1, descending=True).values)  # right padding
    assert torch.equal(a.response_mask, response)
    assert (a.input_ids[a.attention_mask == 0] == 0).all() and (a.input_ids[a.attention_mask == 1] > 0).all()
    assert len(set(a.response_mask.sum(1).tolist())) > 1  # rows differ in length: local != global token counts
    first_real = a.attention_mask.argmax(dim=1)
    assert (a.position_ids[torch.arange(8), first_real] == 0).all()
    assert torch.equal(a.position_ids.max(dim=1).values, a.attention_mask.sum(1) - 1)


def test_mask_shift_fault_moves_both_masks():
    batch = build_batch(Workload(batch_size=2), 50)
    shifted = shift_masks(batch)
    assert torch.equal(shifted.attention_mask[:, 1:], batch.attention_mask[:, :-1])
    assert torch.equal(shifted.response_mask[:, 1:], batch.response_mask[:, :-1])


def test_grpo_loss_at_ratio_one_is_minus_advantage_minus_entropy_bonus():
    workload = Workload(entropy_coeff=0.1)
    logits = torch.randn(2, 3, 7)
    labels = torch.randint(0, 7, (2, 3))
    logp, entropy = logprobs_and_entropy(logits, labels)
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss = masked_loss_sum(workload, logp, entropy, logp.detach(), adv, mask, normalizer=5.0)
    expected = ((-adv - 0.1 * entropy) * mask).sum() / 5.0
    assert torch.allclose(loss, expected)
    sft = masked_loss_sum(Workload(loss="sft"), logp, entropy, logp, adv, mask, normalizer=5.0)
    assert torch.allclose(sft, -(logp * mask).sum() / 5.0)


def test_ppo_clip_stops_the_gradient_outside_the_trust_region():
    workload = Workload(entropy_coeff=0.0, clip_ratio=0.2)
    logp = torch.tensor([[0.5]], requires_grad=True)  # ratio e^0.5 = 1.65 > 1.2
    masked_loss_sum(workload, logp, torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                    1.0).backward()
    assert logp.grad.item() == 0.0
