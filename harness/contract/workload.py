"""The fixed, seeded batch every engine sees: left-padded prompts, right-padded responses (verl's layout).

Log-probs are over response positions only: token at position P+j is scored by the logits at P+j-1.
A packed engine (`workload.packing: packed`) feeds the same rows without their padding (`pack_rows`): each row's
real tokens, concatenated, position ids restarting at 0 per sequence, as verl's remove-padding path does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from parity.harness.contract.schema import Workload


@dataclass(frozen=True, slots=True)
class Batch:
    """A global batch. Engines shard it themselves by their layout."""

    input_ids: torch.Tensor
    """[B, S] token ids (pad = 0)."""
    attention_mask: torch.Tensor
    """[B, S] 1 for real tokens."""
    position_ids: torch.Tensor
    """[B, S] cumsum(attention_mask) - 1, clamped at 0."""
    response_mask: torch.Tensor
    """[B, R] 1 for real response tokens: the tokens that are scored and trained on."""
    advantages: torch.Tensor
    """[B, R] per-sequence advantages broadcast over tokens (GRPO style)."""
    prompt_len: int
    rewards: torch.Tensor | None = None
    """[B] one seeded scalar reward per row where the workload names an adv_estimator: the trainer computes the
    advantages from them (and `advantages` is then zero); None otherwise."""

    @property
    def response_len(self) -> int:
        return self.response_mask.shape[1]

    def rows(self, index: slice | torch.Tensor) -> Batch:
        """The sub-batch of the given rows (data-parallel shard)."""
        return replace(self, input_ids=self.input_ids[index], attention_mask=self.attention_mask[index],
                       position_ids=self.position_ids[index], response_mask=self.response_mask[index],
                       advantages=self.advantages[index],
                       rewards=None if self.rewards is None else self.rewards[index])

    def response_labels(self) -> torch.Tensor:
        """[B, R] the scored tokens."""
        return self.input_ids[:, self.prompt_len:]


def next_token_labels(batch: Batch) -> torch.Tensor:
    """[B, S] the token each position scores: position i scores token i+1 (0 past the end)."""
    return torch.cat([batch.input_ids[:, 1:], torch.zeros_like(batch.input_ids[:, :1])], dim=1)


def per_position(batch: Batch, values: torch.Tensor) -> torch.Tensor:
    """[B, R] response-aligned values -> [B, S] aligned with the logits that score them (0 elsewhere)."""
    out = torch.zeros(batch.input_ids.shape, dtype=values.dtype)
    out[:, batch.prompt_len - 1:-1] = values
    return out


@dataclass(frozen=True, slots=True)
class PackedRows:
    """Some rows of a Batch without their padding, concatenated in row order (verl's `use_remove_padding`,
    Megatron's THD): token t is (row[t], col[t]) of the padded [B, S] batch. A tensor aligned with the padded
    batch moves to this order as `values[packed.row, packed.col]`; a result comes back the same way."""

    input_ids: torch.Tensor
    """[T] the real tokens of the rows, row after row."""
    position_ids: torch.Tensor
    """[T] the position inside its own sequence: 0 at each row's first real token (HF's cumsum(mask) - 1)."""
    cu_seqlens: torch.Tensor
    """[n + 1] int32 cumulative sequence ends, starting at 0 (flash-attention's / TE's convention)."""
    row: torch.Tensor
    """[T] the batch row of each token."""
    col: torch.Tensor
    """[T] its column in the padded [B, S] layout."""

    @property
    def seqlens(self) -> list[int]:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, S, ...] values of the padded batch -> [T, ...] in packed order."""
        return padded[self.row, self.col]


def pack_rows(batch: Batch, rows: torch.Tensor | None = None) -> PackedRows:
    """The real tokens of `rows` (default: every row) of the padded batch, concatenated in that order."""
    rows = torch.arange(batch.input_ids.shape[0]) if rows is None else rows
    real = batch.attention_mask[rows].bool()
    row_of, col = real.nonzero(as_tuple=True)  # row-major: each row's tokens in column order
    row = rows[row_of]
    lengths = real.sum(dim=1)
    cu_seqlens = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu_seqlens[1:] = lengths.cumsum(0)
    return PackedRows(input_ids=batch.input_ids[row, col], position_ids=batch.position_ids[row, col],
                      cu_seqlens=cu_seqlens, row=row, col=col)


GRPO_EPS = 1e-6
"""verl's epsilon in compute_grpo_outcome_advantage (verl/trainer/ppo/core_algos.py)."""


def build_batch(workload: Workload, vocab_size: int) -> Batch:
    """Deterministic from workload.seed alone (its own generator, never the global RNG)."""
    gen = torch.Generator().manual_seed(workload.seed)
    if workload.adv_estimator is not None:
        return _rewarded_batch(workload, vocab_size, gen)
    if workload.advantages == "group_normalized":
        return _grouped_batch(workload, vocab_size, gen)
    bsz, plen, rlen = workload.batch_size, workload.prompt_len, workload.response_len
    min_p = workload.min_prompt_len or max(1, plen // 2)
    min_r = workload.min_response_len or max(1, rlen // 2)
    prompt_lens = torch.randint(min_p, plen + 1, (bsz,), generator=gen)
    response_lens = torch.randint(min_r, rlen + 1, (bsz,), generator=gen)
    tokens = torch.randint(1, vocab_size, (bsz, plen + rlen), generator=gen)
    advantages = torch.randn(bsz, 1, generator=gen).expand(bsz, rlen).contiguous()
    return _assemble(tokens, prompt_lens, response_lens, advantages, plen)


def _grouped_batch(workload: Workload, vocab_size: int, gen: torch.Generator) -> Batch:
    """GRPO's batch: `group_size` consecutive rows answer one prompt (same prompt tokens), with one response
    length per group so that sum_i A_i * len_i = 0 per group and the step-1 loss (ratio 1, pg = -A) keeps only
    model-dependent terms. Consecutive rows keep a group on one data-parallel shard when dp divides the groups."""
    bsz, plen, rlen, size = workload.batch_size, workload.prompt_len, workload.response_len, workload.group_size
    assert size is not None  # the schema requires it for group_normalized
    groups = bsz // size
    min_p = workload.min_prompt_len or max(1, plen // 2)
    min_r = workload.min_response_len or max(1, rlen // 2)
    prompt_lens = torch.randint(min_p, plen + 1, (groups,), generator=gen).repeat_interleave(size)
    response_lens = torch.randint(min_r, rlen + 1, (groups,), generator=gen).repeat_interleave(size)
    prompts = torch.randint(1, vocab_size, (groups, plen), generator=gen).repeat_interleave(size, dim=0)
    responses = torch.randint(1, vocab_size, (bsz, rlen), generator=gen)
    rewards = torch.randn(groups, size, generator=gen)
    advantages = group_normalized_advantages(rewards).reshape(bsz, 1).expand(bsz, rlen).contiguous()
    batch = _assemble(torch.cat([prompts, responses], dim=1), prompt_lens, response_lens, advantages, plen)
    # verl returns scores.unsqueeze(-1) * response_mask: zero past the end of each response
    return replace(batch, advantages=batch.advantages * batch.response_mask)


def _rewarded_batch(workload: Workload, vocab_size: int, gen: torch.Generator) -> Batch:
    """An adv_estimator's batch: seeded rewards, advantages left to the trainer. With group_size, `group_size`
    consecutive rows answer one prompt (verl's rollout.n, repeated interleaved); each row has its own response
    length (unlike _grouped_batch), so the advantage term of the loss does not cancel."""
    bsz, plen, rlen = workload.batch_size, workload.prompt_len, workload.response_len
    size = workload.group_size or 1
    groups = bsz // size
    min_p = workload.min_prompt_len or max(1, plen // 2)
    min_r = workload.min_response_len or max(1, rlen // 2)
    prompt_lens = torch.randint(min_p, plen + 1, (groups,), generator=gen).repeat_interleave(size)
    response_lens = torch.randint(min_r, rlen + 1, (bsz,), generator=gen)
    prompts = torch.randint(1, vocab_size, (groups, plen), generator=gen).repeat_interleave(size, dim=0)
    responses = torch.randint(1, vocab_size, (bsz, rlen), generator=gen)
    rewards = torch.randn(bsz, generator=gen)
    batch = _assemble(torch.cat([prompts, responses], dim=1), prompt_lens, response_lens,
                      torch.zeros(bsz, rlen), plen)
    return replace(batch, rewards=rewards)


def group_normalized_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """[G, n] scalar rewards -> (r - mean) / (std + eps) within each group, std unbiased as torch.std
    (verl's compute_grpo_outcome_advantage, norm_adv_by_std_in_grpo=True)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + GRPO_EPS)


def _assemble(tokens: torch.Tensor, prompt_lens: torch.Tensor, response_lens: torch.Tensor,
              advantages: torch.Tensor, plen: int) -> Batch:
    """Pads seeded tokens to the lengths: prompts on the left, responses on the right (verl's layout)."""
    rlen = tokens.shape[1] - plen
    positions = torch.arange(plen + rlen)
    prompt_real = positions[None, :plen] >= (plen - prompt_lens[:, None])
    response_real = positions[None, :rlen] < response_lens[:, None]
    attention_mask = torch.cat([prompt_real, response_real], dim=1).long()
    input_ids = tokens * attention_mask
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return Batch(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                 response_mask=response_real.long(), advantages=advantages, prompt_len=plen)


def shift_masks(batch: Batch) -> Batch:
    """Fault: attention and loss masks rolled one token to the right (a classic off-by-one)."""
    return replace(batch, attention_mask=batch.attention_mask.roll(1, dims=1),
                   response_mask=batch.response_mask.roll(1, dims=1))
