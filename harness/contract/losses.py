"""Loss math shared by every engine, so that a parity difference is the engine's, not the loss's.

Each engine computes the loss of its local shard as its share of the global aggregate: for token-mean (the
default, verl's) sum(per-token loss) / normalizer, where the normalizer is the GLOBAL count of real response
tokens; the sequence modes divide by the GLOBAL number of sequences instead. Engines whose gradient reduction
averages over R ranks multiply by R before backward.
"""

from __future__ import annotations

import torch

from parity.harness.contract.schema import Workload


def logprobs_and_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log p(label) and entropy, in fp32. logits [..., V], labels [...]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    token_logp = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy


def token_losses(workload: Workload, logprobs: torch.Tensor, entropy: torch.Tensor,
                 old_logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Per-token loss (not yet masked or normalised)."""
    if workload.loss == "sft":
        return -logprobs
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1.0 - workload.clip_ratio, 1.0 + workload.clip_ratio)
    pg = torch.maximum(-advantages * ratio, -advantages * clipped)
    return pg - workload.entropy_coeff * entropy


def masked_loss_sum(workload: Workload, logprobs: torch.Tensor, entropy: torch.Tensor,
                    old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                    normalizer: float, sequences: float | None = None) -> torch.Tensor:
    """This shard's share of the global loss in the workload's loss_agg_mode. `normalizer` is the global token
    count (token-mean); `sequences` the global number of sequences, which the sequence modes divide by."""
    per_token = token_losses(workload, logprobs, entropy, old_logprobs, advantages)
    return aggregate(workload.loss_agg_mode, per_token, mask, normalizer, sequences)


def aggregate(mode: str, per_token: torch.Tensor, mask: torch.Tensor, tokens: float,
              sequences: float | None) -> torch.Tensor:
    """verl's agg_loss (verl/trainer/ppo/core_algos.py) over [rows, positions] losses, written once here for
    the reference: the sequence modes sum per row (the last dimension), then divide by the global sequence count;
    seq-mean-token-sum-norm further by the response length (verl's default loss_scale_factor)."""
    masked = per_token * mask
    if mode == "token-mean":
        return masked.sum() / tokens
    if mode == "token-sum":
        return masked.sum()
    if sequences is None:
        raise ValueError(f"loss_agg_mode {mode} needs the global number of sequences")
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / (mask.sum(-1) + 1e-8)).sum() / sequences
    seq_mean = masked.sum(-1).sum() / sequences
    if mode == "seq-mean-token-sum":
        return seq_mean
    if mode == "seq-mean-token-sum-norm":
        return seq_mean / mask.shape[-1]
    raise ValueError(f"unknown loss_agg_mode {mode}")
