"""The shared batch and loss: deterministic, padded the way verl pads, and normalised by global tokens."""

from __future__ import annotations

import hashlib

import pytest
import torch
from pydantic import ValidationError

from parity.harness.contract.losses import logprobs_and_entropy, masked_loss_sum
from parity.harness.contract.schema import Workload
from parity.harness.contract.workload import build_batch, group_normalized_advantages, pack_rows, shift_masks


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


def _digest(batch) -> str:
    digest = hashlib.sha256()
    for tensor in (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, batch.advantages):
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:16]


def test_default_batch_and_its_hash_inputs_are_pinned():
    """Every cached reference and golden was recorded on this batch: the grouped option must not move it, nor
    add keys to the scenario's content hash."""
    assert _digest(build_batch(Workload(), 1000)) == "b881f48f0f0b752f"
    assert "advantages" not in Workload().model_dump() and "group_size" not in Workload().model_dump()
    grouped = Workload(batch_size=8, advantages="group_normalized", group_size=4).model_dump()
    assert grouped["advantages"] == "group_normalized" and grouped["group_size"] == 4


GROUPED = Workload(batch_size=8, prompt_len=6, response_len=5, advantages="group_normalized", group_size=4, seed=3)


def test_grouped_batch_shares_prompts_and_lengths_within_a_group():
    before = torch.random.get_rng_state()
    a, b = build_batch(GROUPED, 100), build_batch(GROUPED, 100)
    assert torch.equal(torch.random.get_rng_state(), before)  # its own generator only
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.advantages, b.advantages)
    other = build_batch(GROUPED.model_copy(update={"seed": 4}), 100)
    assert not torch.equal(a.advantages, other.advantages)
    prompts, lengths = a.input_ids[:, :6].reshape(2, 4, 6), a.response_mask.sum(1).reshape(2, 4)
    assert (prompts == prompts[:, :1]).all() and (lengths == lengths[:, :1]).all()
    assert not torch.equal(prompts[0], prompts[1])
    responses = a.input_ids[:, 6:].reshape(2, 4, 5)
    assert not (responses == responses[:, :1]).all()  # n different responses to one prompt
    assert (a.advantages[a.response_mask == 0] == 0).all()  # verl: scores * response_mask


def test_group_normalized_advantages_are_verls():
    """verl's compute_grpo_outcome_advantage: (r - mean) / (std + 1e-6), std unbiased, per prompt index."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    adv = group_normalized_advantages(rewards)
    std = torch.tensor([[1.0, 0.0, 0.0, 1.0]]).std()
    assert torch.allclose(adv[0], (rewards[0] - 0.5) / (std + 1e-6)) and (adv[1] == 0).all()
    batch = build_batch(GROUPED, 100)
    per_row = batch.advantages[:, 0].reshape(2, 4)
    assert torch.allclose(per_row.sum(1), torch.zeros(2), atol=1e-6)
    assert torch.allclose(per_row.std(1), torch.ones(2), atol=1e-5)


def test_grouped_step_one_loss_is_model_dependent_only():
    """ratio 1 at step 1: pg = -A; with one length per group sum_i A_i len_i = 0, so the loss is the entropy bonus
    alone and a loss error is not diluted by a constant no engine computes (seeded advantages: ~90 % of it)."""
    batch = build_batch(Workload(batch_size=8, advantages="group_normalized", group_size=4), 1000)
    mask = batch.response_mask.float()
    assert abs(float((batch.advantages * mask).sum() / mask.sum())) < 1e-6
    seeded = build_batch(Workload(batch_size=8), 1000)
    assert abs(float((seeded.advantages * seeded.response_mask).sum() / seeded.response_mask.sum())) > 0.1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"advantages": "group_normalized"}, "need group_size"),
    ({"advantages": "group_normalized", "group_size": 3}, "not divisible by group_size"),
    ({"group_size": 2}, "group_normalized or an adv_estimator only"),
    ({"adv_estimator": "rloo"}, "need group_size"),
    ({"adv_estimator": "grpo", "group_size": 2, "advantages": "group_normalized"}, "leave `advantages` at its default"),
    ({"mini_batches": 3}, "not divisible by mini_batches"),
    ({"adv_estimator": "grpo", "group_size": 2, "mini_batches": 4}, "splits a group"),
    ({"loss": "sft", "use_kl_loss": True}, "apply to loss: grpo only"),
    ({"advantages": "group_normalized", "group_size": 1}, "greater than or equal to 2"),
])
def test_group_size_is_validated(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        Workload(batch_size=4, **kwargs)


def test_packing_is_a_field_of_the_feed_not_of_the_rows():
    """A packed row feeds the SAME rows: same batch, same reference (the padded one), its own id; the default
    stays out of the content hash (every cached reference was recorded without the field)."""
    from parity.harness.contract.schema import Scenario
    from parity.harness.judge.reference import reference_scenario, run_identity

    packed = Workload(packing="packed")
    assert "packing" not in Workload().model_dump() and packed.model_dump()["packing"] == "packed"
    assert packed.padded() == Workload() and Workload().padded() is not None
    assert _digest(build_batch(packed, 1000)) == _digest(build_batch(Workload(), 1000))
    padded_row = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2})
    packed_row = padded_row.model_copy(update={"workload": packed})
    assert packed_row.id == padded_row.id + "+packed" and packed_row.content_hash() != padded_row.content_hash()
    assert reference_scenario(packed_row) == reference_scenario(padded_row)
    assert run_identity(packed_row) == run_identity(padded_row)


def test_pack_rows_concatenates_each_rows_real_tokens_with_restarting_positions():
    batch = build_batch(Workload(batch_size=5, prompt_len=6, response_len=5, seed=7), 100)
    rows = torch.tensor([3, 1, 4])
    packed = pack_rows(batch, rows)
    lengths = batch.attention_mask[rows].sum(1)
    assert packed.seqlens == lengths.tolist() and packed.cu_seqlens.dtype == torch.int32
    assert packed.cu_seqlens[0] == 0 and packed.cu_seqlens[-1] == packed.input_ids.numel()
    for k, row in enumerate(rows.tolist()):
        part = slice(int(packed.cu_seqlens[k]), int(packed.cu_seqlens[k + 1]))
        assert torch.equal(packed.input_ids[part], batch.input_ids[row][batch.attention_mask[row].bool()])
        assert torch.equal(packed.position_ids[part], torch.arange(int(lengths[k])))
        assert (packed.row[part] == row).all()
    assert torch.equal(packed.gather(batch.input_ids), packed.input_ids)
    assert (packed.gather(batch.attention_mask) == 1).all()


@pytest.mark.parametrize("field,value", [("clip_ratio_high", 0.28), ("ppo_epochs", 2), ("use_kl_loss", True),
                                         ("policy_loss", "gspo")])
def test_an_rl_step_setting_an_engine_does_not_implement_is_refused(field, value):
    """A row that sets verl's RL-step key on an engine without it is bad input naming the key; the same row on a
    spec that declares the field validates (the clean twin)."""
    from dataclasses import replace

    from parity.engines.specs import FSDP2
    from parity.harness.config.validate import spec_errors
    from parity.harness.contract.schema import Scenario

    row = Scenario(model="tiny-llama", strategy="fsdp2", layout={"dp": 2}, workload={field: value})
    assert any(key == f"workload.{field}" for key, _ in spec_errors(row, FSDP2))
    assert not any(key == f"workload.{field}" for key, _ in spec_errors(row, replace(FSDP2, rl_step=(field,))))
