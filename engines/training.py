"""The candidate engines' optimizer and learning-rate scheduler over transformers models: torch's AdamW / SGD and
transformers' schedulers, as verl's FSDP engine and HF Trainer build them. The reference (the hf engine) has its own
(parity.reference.optim): a bug here shows as a difference from it."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.schedule import decays, warmup_steps
from parity.harness.contract.schema import Workload


def make_optimizer(named_params: Iterable[tuple[str, torch.nn.Parameter]], workload: Workload,
                   faults: FaultPlan) -> torch.optim.Optimizer:
    """torch's AdamW (or SGD) over the workload's weight-decay groups: one group when every parameter decays, a
    decaying and an exempt one otherwise (schedule.decays; HF Trainer's get_decay_parameter_names groups the same
    way). Fault `weight_decay_on_norms`: every parameter decays whatever the workload exempts."""
    named = list(named_params)
    exempt = "none" if faults.active("weight_decay_on_norms") else workload.weight_decay_exempt
    decaying = [p for name, p in named if decays(name, p.ndim, exempt)]
    exempted = [p for name, p in named if not decays(name, p.ndim, exempt)]
    groups = [{"params": decaying}] + ([{"params": exempted, "weight_decay": 0.0}] if exempted else [])
    if workload.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=workload.lr, weight_decay=workload.weight_decay)
    # foreach=False: the same per-parameter kernels for plain tensors and FSDP2 DTensor shards
    return torch.optim.AdamW(groups, lr=workload.lr, weight_decay=workload.weight_decay, foreach=False)


def make_scheduler(optimizer: torch.optim.Optimizer, workload: Workload,
                   faults: FaultPlan) -> torch.optim.lr_scheduler.LRScheduler:
    """The workload's schedule as transformers' schedulers build it (torch LambdaLRs: what HF Trainer runs; verl's
    FSDP engine has copies of the first two in verl/utils/torch_functional.py). Fault `lr_warmup_ignored`: built
    without the warmup."""
    from transformers import optimization

    warmup = 0 if faults.active("lr_warmup_ignored") else warmup_steps(workload)
    kind = workload.lr_scheduler_type
    if kind == "constant":
        return optimization.get_constant_schedule_with_warmup(optimizer, warmup)
    if kind == "cosine":
        return optimization.get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, workload.steps,
                                                                        min_lr_rate=workload.min_lr_ratio)
    if kind == "linear":
        return optimization.get_linear_schedule_with_warmup(optimizer, warmup, workload.steps)
    raise ValueError(f"no scheduler for lr_scheduler_type {kind!r}")


def step_scheduler(scheduler: torch.optim.lr_scheduler.LRScheduler, faults: FaultPlan, step: int) -> None:
    """Once per optimizer update (fault `lr_scheduler_double_step`: twice, as a scheduler stepped both by the
    engine and by its caller would be)."""
    for _ in range(2 if faults.active("lr_scheduler_double_step", step) else 1):
        scheduler.step()


def param_group_lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    """Every param group's learning rate as the optimizer holds it now (StepOutput.lr)."""
    return [float(group["lr"]) for group in optimizer.param_groups]
