"""The reference's optimizer, learning-rate schedule and update plan: its own AdamW / SGD step (on torch's
Optimizer base for param groups and state dicts), its own schedule lambda (on torch's LambdaLR for the stepping),
its own weight-decay groups, and the order of a training step's updates. Cross-checked in
tests/unit/test_reference_math.py against torch.optim.AdamW / SGD and transformers' schedulers (third sources), each
with a planted wrong twin."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8
"""torch.optim.AdamW's defaults, which verl's and Megatron's optimizers use unless configured."""


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2): theta <- theta (1 - lr wd), then
    m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2, theta <- theta - lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t))
    + eps). Evaluated in this order so that fp32 results are the ones torch's single-tensor AdamW gives."""

    def __init__(self, params: Iterable[Any], lr: float, weight_decay: float) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "betas": ADAM_BETAS, "eps": ADAM_EPS})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr, decay, (beta1, beta2), eps = group["lr"], group["weight_decay"], group["betas"], group["eps"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                t = float(state["step"])
                grad, m, v = param.grad, state["exp_avg"], state["exp_avg_sq"]
                if decay:
                    param.mul_(1 - lr * decay)
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denominator = (v.sqrt() / (1 - beta2 ** t) ** 0.5).add_(eps)
                param.addcdiv_(m, denominator, value=-(lr / (1 - beta1 ** t)))


class SGD(torch.optim.Optimizer):
    """Plain SGD with coupled L2 decay: theta <- theta - lr (g + wd theta)."""

    def __init__(self, params: Iterable[Any], lr: float, weight_decay: float) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad.add(param, alpha=group["weight_decay"]) if group["weight_decay"] else param.grad
                param.add_(grad, alpha=-group["lr"])


def decays(name: str, ndim: int, exempt: str) -> bool:
    """biases_and_norms: `*.bias` and every 1-D parameter (norm weights) take no weight decay (Megatron's default
    param groups); none: every parameter decays."""
    if exempt == "none":
        return True
    if exempt == "biases_and_norms":
        return not (name.endswith(".bias") or ndim == 1)
    raise ValueError(f"unknown weight_decay_exempt {exempt!r}")


def build_optimizer(named_params: Iterable[tuple[str, torch.Tensor]], workload: Any,
                    faults: Any) -> torch.optim.Optimizer:
    """The workload's optimizer over its decay groups (a decaying group, then an exempt one when any parameter is
    exempt). Fault `weight_decay_on_norms`: every parameter decays."""
    named = list(named_params)
    exempt = "none" if faults.active("weight_decay_on_norms") else workload.weight_decay_exempt
    decaying = [p for name, p in named if decays(name, p.ndim, exempt)]
    exempted = [p for name, p in named if not decays(name, p.ndim, exempt)]
    groups = [{"params": decaying}] + ([{"params": exempted, "weight_decay": 0.0}] if exempted else [])
    kind = AdamW if workload.optimizer == "adamw" else SGD
    return kind(groups, lr=workload.lr, weight_decay=workload.weight_decay)


# ---- schedule (verl's lr_scheduler_type / lr_warmup_steps(_ratio) / min_lr_ratio) ------------------------------
def warmup_updates(workload: Any) -> int:
    """Scheduler steps of linear warmup: lr_warmup_steps when > 0, else int(lr_warmup_steps_ratio x steps)
    (verl's engines' rule for `num_warmup_steps <= 0`)."""
    return int(workload.lr_warmup_steps) if workload.lr_warmup_steps > 0 else int(
        workload.lr_warmup_steps_ratio * workload.steps)


def lr_multiplier(kind: str, taken: int, warmup: int, total: int, floor: float) -> float:
    """The lr multiplier after `taken` scheduler steps: a linear ramp taken / warmup from 0, then constant 1, a
    half cosine from 1 down to `floor` at `total`, or a line from 1 down to 0 at `total`."""
    if taken < warmup:
        return float(taken) / float(max(1, warmup))
    progress = float(taken - warmup) / float(max(1, total - warmup))
    if kind == "constant":
        return 1.0
    if kind == "cosine":
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor) + floor)
    if kind == "linear":
        return max(0.0, float(total - taken) / float(max(1, total - warmup)))
    raise ValueError(f"unknown lr_scheduler_type {kind!r}")


def build_scheduler(optimizer: torch.optim.Optimizer, workload: Any,
                    faults: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule as a torch LambdaLR over `lr_multiplier`, stepped once per training step. Fault
    `lr_warmup_ignored`: no warmup."""
    warmup = 0 if faults.active("lr_warmup_ignored") else warmup_updates(workload)
    kind, total, floor = workload.lr_scheduler_type, workload.steps, workload.min_lr_ratio
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda taken: lr_multiplier(kind, taken, warmup, total, floor))


# ---- the order of a training step's updates ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Update:
    epoch: int
    rows: torch.Tensor
    """The mini-batch's rows of the step's batch, in order (verl `shuffle: false`)."""
    step_scheduler: bool
    """Whether the scheduler steps after this update: after the step's last one only (verl _update_actor)."""


def update_plan(workload: Any) -> list[Update]:
    """ppo_epochs passes over mini_batches mini-batches, one optimizer update each; the scheduler after the last.
    The batch is cut into mini_batch_shards consecutive shards, and the i-th mini-batch is the i-th slice of each
    (one shard: consecutive rows)."""
    shard = workload.batch_size // workload.mini_batch_shards
    size = shard // workload.mini_batches
    batches = [torch.cat([torch.arange(s * shard + i * size, s * shard + (i + 1) * size)
                          for s in range(workload.mini_batch_shards)]) for i in range(workload.mini_batches)]
    plan = [Update(epoch, rows, False) for epoch in range(workload.ppo_epochs) for rows in batches]
    plan[-1] = Update(plan[-1].epoch, plan[-1].rows, True)
    return plan
