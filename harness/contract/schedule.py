"""The learning-rate schedule and the weight-decay groups of the workload, as functions of the step: what every
engine's OWN scheduler must reproduce, and what the judge compares each engine's per-step learning rate (read back
from its optimizer) with. Nothing here builds a scheduler.

Semantics are verl's (verl 0.9.1 and main): verl/utils/torch_functional.py `get_constant_schedule_with_warmup` /
`get_cosine_schedule_with_warmup` (num_cycles 0.5, init_lr_ratio 0, zero_indexed_step), the warmup length from
verl/workers/engine/fsdp/transformer_impl.py `_build_lr_scheduler`. A scheduler that has taken `s` steps (s updates
done) gives the factor `lr_factor(workload, s)`, so update k (1-based) runs at `lr_at(workload, k)` = lr x factor(k-1):
the first update of a warmup runs at 0, as in verl and Megatron (init_lr 0).

Megatron's OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py get_lr) gives the same numbers when
configured as verl's Megatron engine does (verl/utils/megatron/optimizer.py get_megatron_optimizer_param_scheduler):
init_lr 0, max_lr = lr, min_lr = min_lr_ratio x lr, lr_decay_steps = the run's steps, lr_warmup_steps as below. Its
warmup `init + (max - init) x s / W` for s <= W reaches max at s = W, where verl's cosine restarts at progress 0
(factor 1): equal. Its cosine `min + (max - min) x 0.5 (1 + cos(pi x (s - W) / (D - W)))` is verl's with D = steps;
its linear `min + (max - min) x (1 - (s - W) / (D - W))` is transformers' get_linear_schedule_with_warmup with
min 0 (the reference's linear scheduler; hence linear takes no floor here). Past the last step the two differ
(verl's cosine rises again, Megatron holds min_lr): no run reaches it.
"""

from __future__ import annotations

import math
from typing import Any


def warmup_steps(workload: Any) -> int:
    """Updates of linear warmup: lr_warmup_steps when > 0, else int(lr_warmup_steps_ratio x steps) (verl's FSDP
    engine: `if num_warmup_steps <= 0: int(ratio * total_steps)`; its Megatron engine: the same over
    lr_decay_steps = total_training_steps)."""
    if workload.lr_warmup_steps > 0:
        return int(workload.lr_warmup_steps)
    return int(workload.lr_warmup_steps_ratio * workload.steps)


def lr_factor(workload: Any, scheduler_steps: int) -> float:
    """The schedule's factor on `workload.lr` after the scheduler has stepped `scheduler_steps` times."""
    s, warmup, total = scheduler_steps, warmup_steps(workload), workload.steps
    if s < warmup:
        return float(s) / float(max(1, warmup))
    if workload.lr_scheduler_type == "constant":
        return 1.0
    progress = float(s - warmup) / float(max(1, total - warmup))
    if workload.lr_scheduler_type == "cosine":
        floor = workload.min_lr_ratio
        return max(floor, math.cos(math.pi * progress) * (1 - floor) * 0.5 + (1 + floor) * 0.5)
    if workload.lr_scheduler_type == "linear":
        return max(0.0, 1.0 - progress)
    raise ValueError(f"unknown lr_scheduler_type {workload.lr_scheduler_type!r}")


def lr_at(workload: Any, update: int) -> float:
    """The learning rate update `update` (1-based) applies."""
    return workload.lr * lr_factor(workload, update - 1)


def describe(workload: Any) -> str:
    """The schedule in words, for failure messages: 'warmup 4, cosine to 0.1 x lr over 50 steps'."""
    parts = [f"warmup {warmup_steps(workload)}"] if warmup_steps(workload) else []
    kind = workload.lr_scheduler_type
    parts.append(f"cosine to {workload.min_lr_ratio:g} x lr" if kind == "cosine" else kind)
    return f"lr {workload.lr:g}, {', '.join(parts)} over {workload.steps} steps"


def decays(name: str, ndim: int, exempt: str) -> bool:
    """Whether weight decay applies to a parameter, by the workload's `weight_decay_exempt`: biases_and_norms
    exempts `*.bias` and every 1-D parameter (norm weights), as Megatron's default param groups do; none exempts
    nothing. `name` in the engine's own naming (the rule reads only its `.bias` suffix)."""
    if exempt == "none":
        return True
    if exempt == "biases_and_norms":
        return not (name.endswith(".bias") or ndim == 1)
    raise ValueError(f"unknown weight_decay_exempt {exempt!r}")
