"""Loss math shared by every engine, so that a parity difference is the engine's, not the loss's.

Each engine computes the loss of its local shard as sum(per-token loss) / normalizer, where the normalizer
is the GLOBAL count of real response tokens (verl's token-mean). Engines whose gradient reduction averages
over R ranks multiply by R before backward.
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
                    normalizer: float) -> torch.Tensor:
    """This shard's share of the token-mean loss: sum over its real tokens / normalizer."""
    per_token = token_losses(workload, logprobs, entropy, old_logprobs, advantages)
    return (per_token * mask).sum() / normalizer
