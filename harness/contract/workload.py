"""The fixed, seeded batch every engine sees: left-padded prompts, right-padded responses (verl's layout).

Log-probs are over response positions only: token at position P+j is scored by the logits at P+j-1.
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

    @property
    def response_len(self) -> int:
        return self.response_mask.shape[1]

    def rows(self, index: slice | torch.Tensor) -> Batch:
        """The sub-batch of the given rows (data-parallel shard)."""
        return replace(self, input_ids=self.input_ids[index], attention_mask=self.attention_mask[index],
                       position_ids=self.position_ids[index], response_mask=self.response_mask[index],
                       advantages=self.advantages[index])

    def response_labels(self) -> torch.Tensor:
        """[B, R] the scored tokens."""
        return self.input_ids[:, self.prompt_len:]


def build_batch(workload: Workload, vocab_size: int) -> Batch:
    """Deterministic from workload.seed alone (its own generator, never the global RNG)."""
    gen = torch.Generator().manual_seed(workload.seed)
    bsz, plen, rlen = workload.batch_size, workload.prompt_len, workload.response_len
    min_p = workload.min_prompt_len or max(1, plen // 2)
    min_r = workload.min_response_len or max(1, rlen // 2)
    prompt_lens = torch.randint(min_p, plen + 1, (bsz,), generator=gen)
    response_lens = torch.randint(min_r, rlen + 1, (bsz,), generator=gen)
    tokens = torch.randint(1, vocab_size, (bsz, plen + rlen), generator=gen)
    positions = torch.arange(plen + rlen)
    prompt_real = positions[None, :plen] >= (plen - prompt_lens[:, None])
    response_real = positions[None, :rlen] < response_lens[:, None]
    attention_mask = torch.cat([prompt_real, response_real], dim=1).long()
    input_ids = tokens * attention_mask
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    advantages = torch.randn(bsz, 1, generator=gen).expand(bsz, rlen).contiguous()
    return Batch(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                 response_mask=response_real.long(), advantages=advantages, prompt_len=plen)


def shift_masks(batch: Batch) -> Batch:
    """Fault: attention and loss masks rolled one token to the right (a classic off-by-one)."""
    return replace(batch, attention_mask=batch.attention_mask.roll(1, dims=1),
                   response_mask=batch.response_mask.roll(1, dims=1))
