"""The checks of a rollout row and their limits.

- rollout_vs_trainer: the rollout's log-probs of its own tokens against the trainer's scores of the same tokens,
  before any training (verl's training/rollout_probs_diff_* and the rollout-correction weights are reported here).
  At temperature 1 these are the log-probs vLLM returned with its samples; at another temperature, vLLM's scores of
  the same sequences at temperature 1 (the trainer scores at 1).
- sampled_logprobs: the log-probs vLLM returned with its samples against the fp32 reference's (plain transformers,
  the same weights) at the row's sampling temperature: the distribution it sampled from.
- weight_sync: after `sync_after_steps` training steps and the sync, vLLM's scores of the same sequences against the
  trained trainer's.
- training_moved: the trained trainer's scores moved further from its first scores than the weight_sync limit (so
  a sync that left vLLM's weights as they were cannot pass); a row where they did not is an ERROR of the row.
Default limits per dtype (docs/tolerances.md, "Rollout ↔ trainer", with the command that measures the spread).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from parity.rollout.metrics import logprob_diff, rollout_figures
from parity.rollout.schema import RolloutRow

#: dtype -> (rollout_vs_trainer, weight_sync, sampled_logprobs) max |Δ log-prob| defaults
DEFAULT_LIMITS: dict[str, tuple[float, float, float]] = {
    "fp32": (2e-5, 2e-5, 2e-5),
    "bf16": (1e-1, 1e-1, 1e-1),
}


def limits(row: RolloutRow) -> dict[str, float]:
    rollout, sync, sampled = DEFAULT_LIMITS[row.trainer.dtype]
    tol = row.tolerance
    return {"rollout_vs_trainer": tol.rollout_logprob_max_abs or rollout,
            "weight_sync": tol.sync_logprob_max_abs or sync,
            "sampled_logprobs": tol.sampled_logprob_max_abs or sampled}


@dataclass
class RolloutVerdict:
    id: str
    status: str
    """PASS, FAIL, ERROR or SKIP."""
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, dict[str, float]] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "reasons": self.reasons, "figures": self.figures,
                "limits": self.limits, "info": self.info}


def judge(row: RolloutRow, mask: torch.Tensor, *, rollout_at_1: torch.Tensor, sampled: torch.Tensor,
          reference_sampled: torch.Tensor, trainer_before: torch.Tensor, trainer_after: torch.Tensor,
          synced: torch.Tensor, info: dict[str, Any]) -> RolloutVerdict:
    """All [B, R] log-probs of the same tokens; mask = the scored (response) tokens."""
    bounds = limits(row)
    figures = {
        "rollout_vs_trainer": rollout_figures(rollout_at_1, trainer_before, mask),
        "sampled_logprobs": logprob_diff(sampled, reference_sampled, mask),
        "weight_sync": rollout_figures(synced, trainer_after, mask),
        "training_moved": logprob_diff(trainer_after, trainer_before, mask),
    }
    observed = {"rollout_vs_trainer": figures["rollout_vs_trainer"]["logprob_max_abs"],
                "sampled_logprobs": figures["sampled_logprobs"]["max"],
                "weight_sync": figures["weight_sync"]["logprob_max_abs"]}
    reasons = [f"{check}: max |Δ log-prob| = {value:.3g} > limit {bounds[check]:.3g}"
               for check, value in observed.items() if not value <= bounds[check]]
    status = "FAIL" if reasons else "PASS"
    moved = figures["training_moved"]["max"]
    if moved <= bounds["weight_sync"]:
        status = "ERROR"
        reasons.append(f"training_moved: the trainer's log-probs moved only {moved:.3g} in "
                       f"{row.sync_after_steps} steps, not more than the weight_sync limit "
                       f"{bounds['weight_sync']:.3g}: the sync check could not tell synced from stale weights")
    return RolloutVerdict(row.id, status, reasons, figures, bounds, info)
