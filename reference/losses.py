"""The reference's scoring and RL-step math: token log-probs and entropy, outcome advantages, the KL estimators,
verl's policy losses and their aggregation. Its own code, written from the definitions (each function cites the
paper / verl function whose documented math it follows); cross-checked in tests/unit/test_reference_math.py against
torch's cross-entropy and hand-derived numbers, each check with a planted wrong twin."""

from __future__ import annotations

from typing import Any

import torch

#: verl's epsilon in compute_grpo_outcome_advantage (std + eps)
GRPO_EPS = 1e-6
#: verl_F.masked_whiten's variance epsilon (rsqrt(var + eps))
WHITEN_EPS = 1e-8
#: clip_cov / kl_cov settings at verl's config defaults (actor.policy_loss.*, verl/workers/config/actor.py
#: PolicyLossConfig; the Workload does not vary them). ppo_kl_coef is 0.1 there: the 1.0 in compute_policy_loss_kl_cov
#: is only its fallback for a config without the field
CLIP_COV_RATIO, CLIP_COV_LB, CLIP_COV_UB = 0.0002, 1.0, 5.0
KL_COV_RATIO, PPO_KL_COEF = 0.0002, 0.1


# ---- scoring -------------------------------------------------------------------------------------------------
def token_scores(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(label) and the entropy H = -sum_v p_v log p_v of each position's distribution, in fp32.
    logits [..., V], labels [...]."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    chosen = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return chosen, entropy


def response_positions(logits: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The logits that predict the response tokens: position t predicts token t + 1, so P-1 .. S-2."""
    return logits[:, prompt_len - 1:-1]


# ---- advantages (verl compute_advantage; outcome reward on each response's last real token) -------------------
def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] scalar rewards -> [B, R] token rewards: each on its row's last real response token (verl's reward
    manager writes the score at valid_response_length - 1)."""
    last = mask.long().sum(-1) - 1
    token_rewards = torch.zeros(mask.shape, dtype=torch.float32)
    token_rewards[torch.arange(mask.shape[0]), last] = rewards.float()
    return token_rewards


def advantages(estimator: str, rewards: torch.Tensor, mask: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """[B, R] advantages of an outcome-reward batch whose groups are `group_size` consecutive rows."""
    token_rewards = outcome_token_rewards(rewards, mask)
    mask = mask.float()
    if estimator == "grpo":
        return grpo_advantages(token_rewards.sum(-1), group_size or 1).unsqueeze(-1) * mask
    if estimator == "rloo":
        return rloo_advantages(token_rewards.sum(-1), group_size or 1).unsqueeze(-1) * mask
    if estimator == "reinforce_plus_plus":
        return reinforce_plus_plus_advantages(token_rewards, mask)
    if estimator == "gae":
        raise ValueError("adv_estimator gae needs a critic: GAE's advantages are built from a value model's "
                         "per-token values (verl compute_gae_advantage_return), which the reference does not train")
    raise ValueError(f"unknown adv_estimator {estimator!r}")


def grpo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO (Shao et al. 2024, eq. outcome supervision): (r - mean_group) / (std_group + eps), std unbiased
    (verl compute_grpo_outcome_advantage, norm_adv_by_std_in_grpo=True). A group of one: r itself."""
    groups = scores.reshape(-1, group_size)
    if group_size == 1:
        return scores.clone()
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, unbiased=True)
    return ((groups - mean) / (std + GRPO_EPS)).reshape(-1)


def rloo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): r_i minus the mean of the OTHER responses of its group,
    r_i - (sum_group - r_i) / (n - 1). A group of one: r itself."""
    if group_size == 1:
        return scores.clone()
    groups = scores.reshape(-1, group_size)
    others = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1)


def reinforce_plus_plus_advantages(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++ (Hu 2025) with gamma 1: each token's return is the sum of the rewards from it to the end of its
    response, then whitened over every real token of the batch (global batch normalisation; verl
    compute_reinforce_plus_plus_outcome_advantage -> masked_whiten, unbiased variance, mean shifted out)."""
    returns = torch.flip(torch.cumsum(torch.flip(token_rewards * mask, dims=[-1]), dim=-1), dims=[-1]) * mask
    count = mask.sum()
    if count < 2:
        raise ValueError("REINFORCE++ whitens over the batch's response tokens: it needs at least two")
    mean = (returns * mask).sum() / count
    variance = (((returns - mean) ** 2) * mask).sum() / (count - 1)
    return (returns - mean) / torch.sqrt(variance + WHITEN_EPS) * mask


# ---- KL estimators (Schulman, "Approximating KL divergence", 2020; verl kl_penalty_forward) ---------------------
def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy, log r = ref_logp - logp:
    k1 = -log r, |k1| (abs), k2 = (log r)^2 / 2 (mse), k3 = r - 1 - log r (low_var_kl, log r and k3 clamped to
    +-20 / +-10 as verl does for stability)."""
    if kind in ("kl", "k1"):
        return logp - ref_logp
    if kind == "abs":
        return (logp - ref_logp).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logp - ref_logp) ** 2
    if kind in ("low_var_kl", "k3"):
        log_r = (ref_logp - logp).clamp(-20.0, 20.0)
        return (torch.exp(log_r) - 1 - log_r).clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl_loss_type {kind!r}")


# ---- aggregation (verl agg_loss) -----------------------------------------------------------------------------
def aggregate(mode: str, per_token: torch.Tensor, mask: torch.Tensor, tokens: float,
              sequences: float) -> torch.Tensor:
    """[rows, positions] losses -> one number: token-mean divides the masked sum by `tokens` (the mini-batch's real
    response tokens), token-sum does not divide; the sequence modes average per-row token sums (or means) over
    `sequences`, seq-mean-token-sum-norm further by the response length (verl's default loss_scale_factor)."""
    masked = per_token * mask
    if mode == "token-mean":
        return masked.sum() / tokens
    if mode == "token-sum":
        return masked.sum()
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / (mask.sum(-1) + 1e-8)).sum() / sequences
    if mode == "seq-mean-token-sum":
        return masked.sum(-1).sum() / sequences
    if mode == "seq-mean-token-sum-norm":
        return masked.sum(-1).sum() / sequences / mask.shape[-1]
    raise ValueError(f"unknown loss_agg_mode {mode!r}")


# ---- policy losses (verl's registry, core_algos.compute_policy_loss_*) ----------------------------------------
def policy_losses(workload: Any, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                  mask: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Per-token policy-gradient losses and the loss_agg_mode they are aggregated in."""
    mode = workload.policy_loss
    if mode == "vanilla":
        return ppo_dual_clip(logp, old_logp, adv, workload.clip_low, workload.clip_high,
                             workload.clip_ratio_c), workload.loss_agg_mode
    if mode == "gspo":
        return gspo(logp, old_logp, adv, mask, workload.clip_low, workload.clip_high), "seq-mean-token-mean"
    if mode == "clip_cov":
        return clip_cov(logp, old_logp, adv, mask, workload.clip_low, workload.clip_high), workload.loss_agg_mode
    if mode == "kl_cov":
        return kl_cov(logp, old_logp, adv, mask), workload.loss_agg_mode
    raise ValueError(f"unknown policy_loss {mode!r}")


def ppo_dual_clip(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float,
                  clip_high: float, clip_c: float) -> torch.Tensor:
    """PPO-clip (Schulman et al. 2017) with an asymmetric range [1 - low, 1 + high] (DAPO's clip-higher) and the
    dual clip (Ye et al. 2020): for A < 0 the loss is capped at -A * clip_c. The log-ratio is clamped to +-20
    (verl compute_policy_loss_vanilla)."""
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high))
    return torch.where(adv < 0, torch.minimum(-adv * clip_c, clipped), clipped)


def gspo(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip_low: float,
         clip_high: float) -> torch.Tensor:
    """GSPO (Zheng et al. 2025): the sequence ratio s_i = exp(mean_t log(pi / pi_old)) over the response's real
    tokens, carried per token as sg[s_i] * pi_t / sg[pi_t] so its gradient flows through each token; clipped to
    [1 - low, 1 + high] (log s clamped at 10 as verl compute_policy_loss_gspo does)."""
    lengths = mask.sum(-1).clamp(min=1)
    log_seq_ratio = (((logp - old_logp) * mask).sum(-1) / lengths).detach().unsqueeze(-1)
    ratio = torch.exp((log_seq_ratio + (logp - logp.detach())).clamp(max=10.0))
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high))


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / (mask.sum() + 1e-8)


def clip_cov(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip_low: float,
             clip_high: float) -> torch.Tensor:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for reasoning LMs"): PPO-clip without the dual clip,
    whose gradient is cut on a few tokens of high centred covariance cov = (A - mean A)(log p - mean log p) in
    (lb, ub), ratio clip_cov_ratio of the real tokens (at least one), among those the clip did not already cut. More
    candidates than that: a random subset, drawn from torch's global generator as verl does."""
    ratio = torch.exp(logp - old_logp)
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    real = mask > 0
    cov = (adv - _masked_mean(adv, mask)) * (logp.detach() - _masked_mean(logp.detach(), mask))
    candidates = torch.nonzero(real & ~(clipped > unclipped) & (cov > CLIP_COV_LB) & (cov < CLIP_COV_UB))
    count = max(int(CLIP_COV_RATIO * float(mask.sum())), 1)
    if len(candidates) > count:
        candidates = candidates[torch.randperm(len(candidates))[:count]]
    keep = torch.ones_like(adv)
    keep[candidates[:, 0], candidates[:, 1]] = 0
    return torch.maximum(unclipped, clipped) * keep


def kl_cov(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL-Cov (Cui et al. 2025): the unclipped policy gradient, plus ppo_kl_coef * |log(pi / pi_old)| on the
    kl_cov_ratio share (at least one) of real tokens with the LARGEST centred covariance (A - mean A)(log p - mean
    log p), means over the real tokens."""
    log_ratio = logp - old_logp
    losses = -adv * torch.exp(log_ratio)
    real = mask > 0
    flat = torch.nonzero(real.reshape(-1)).squeeze(-1)
    a, lp = adv.detach().reshape(-1)[flat], logp.detach().reshape(-1)[flat]
    cov = (a - a.mean()) * (lp - lp.mean())
    top = flat[torch.topk(cov, max(1, int(len(cov) * KL_COV_RATIO))).indices]
    penalty = torch.zeros(adv.numel(), dtype=losses.dtype, device=losses.device)
    penalty[top] = 1.0
    return losses + PPO_KL_COEF * log_ratio.abs() * penalty.reshape(adv.shape)


# ---- the step's loss -----------------------------------------------------------------------------------------
def step_loss(workload: Any, logp: torch.Tensor, entropy: torch.Tensor, old_logp: torch.Tensor,
              adv: torch.Tensor, mask: torch.Tensor, tokens: float, sequences: float,
              ref_logp: torch.Tensor | None = None) -> torch.Tensor:
    """One update's loss over its rows: SFT's -log p, or the policy loss - entropy_coeff x entropy
    (+ kl_loss_coef x KL to the reference policy), each term aggregated in its mode (verl's
    workers/utils/losses.py ppo_loss: pg_loss - coeff * agg(entropy) + coef * agg(kl)). Terms sharing the mode are
    summed per token before one aggregation: agg is linear in the per-token losses."""
    mode = workload.loss_agg_mode
    if workload.loss == "sft":
        return aggregate(mode, -logp, mask, tokens, sequences)
    pg, pg_mode = policy_losses(workload, logp, old_logp, adv, mask)
    extra = -workload.entropy_coeff * entropy
    if workload.use_kl_loss:
        if ref_logp is None:
            raise ValueError("use_kl_loss needs the reference policy's log-probs")
        extra = extra + workload.kl_loss_coef * kl_estimate(logp, ref_logp, workload.kl_loss_type)
    if pg_mode == mode:
        return aggregate(mode, pg + extra, mask, tokens, sequences)
    return aggregate(pg_mode, pg, mask, tokens, sequences) + aggregate(mode, extra, mask, tokens, sequences)

