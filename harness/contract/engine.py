"""The one small interface every engine implements (built-in or third-party, named by import path).
Engines import this contract package and nothing else of the harness.

The worker drives it: `setup()`; `forward(batch)` for log-probs; `train_step(batch, old_logprobs, step)` for
each step; `forward(batch)` again. An engine shards the global batch itself according to its layout and
returns WHOLE tensors (gathered over its ranks) on rank 0; other ranks may return None.
See docs/engines.md for a worked third-party example.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.schema import Scenario
from parity.harness.contract.spec import EngineSpec
from parity.harness.contract.workload import Batch

#: scenario dtype name -> torch dtype
TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}


@dataclass(frozen=True, slots=True)
class EngineContext:
    """Everything an engine needs to know about its run; built by the worker."""

    scenario: Scenario
    checkpoint: Path
    """A loadable HF checkpoint directory."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    faults: FaultPlan = field(default_factory=FaultPlan)

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.scenario.dtype]


@dataclass(frozen=True, slots=True)
class TokenOutputs:
    """Forward results over the response positions of the whole global batch."""

    logprobs: torch.Tensor
    """[B, R] fp32 log p(token)."""
    entropy: torch.Tensor
    """[B, R] fp32 entropy of the predicted distribution."""


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One optimizer step: the global loss and the gradient norm BEFORE clipping."""

    loss: float
    grad_norm: float
    group_grad_norms: dict[str, float] | None = None
    """Optional per-module fingerprint: pre-clip grad norm per parameter group in HF naming
    (parity.harness.contract.grad_groups), whole over all ranks. None = not reported (not compared)."""
    expert_load: dict[str, list[float]] | None = None
    """Optional, MoE: per MoE layer (`layers.i.mlp`), how many tokens of this step's training forward the router
    sent to each expert AS THE ROUTER'S LOAD STATISTICS COUNT THEM (what an aux loss or expert-bias update
    balances): real tokens only, never padding. Summed over micro-batches and ranks, each token once. None = not
    reported; compared when a scenario sets `tolerance.expert_load_abs`."""
    lr: list[float] | None = None
    """The learning rate of every optimizer param group at this step's update, read back from the optimizer's own
    param groups as its step ran (the engine's scheduler set them), in the optimizer's group order. Compared with
    the workload's schedule (parity.harness.contract.schedule.lr_at); None = not reported (not compared)."""
    updates: list[tuple[float, float]] | None = None
    """(loss, pre-clip grad norm) of EVERY optimizer update of this step, in order, where the workload takes more
    than one per step (Workload.updates_per_step: mini_batches x ppo_epochs); `loss` / `grad_norm` then repeat the
    last. The other fields describe the step's last update (lr: every update of a step runs at one lr, the scheduler
    steps once per step). None: the step took one update."""


class Engine(ABC):
    """A training backend under test."""

    spec: ClassVar[EngineSpec | None] = None
    """Optional for third-party engines: what the harness may assume before running it (layout dimensions,
    kwargs blocks, devices, packages). Built-in engines' specs live in parity.engines.specs and each built-in class
    sets its own, so a third-party engine that extends one inherits it (parity.harness.config.registry)."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def setup(self) -> None:
        """Build the model (from ctx.checkpoint), the parallel wrappers and the optimizer."""

    @abstractmethod
    def forward(self, batch: Batch) -> TokenOutputs | None:
        """Log-probs and entropy of the response tokens, no grad. Whole batch on rank 0."""

    @abstractmethod
    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput | None:
        """zero_grad -> forward/backward of the workload loss -> pre-clip grad norm -> clip -> optimizer step.
        `old_logprobs` is the whole-batch [B, R] output of the first forward. Result on rank 0."""

    def applied_kwargs(self) -> dict[str, Any]:
        """Every mcore_kwargs / fsdp_kwargs / engine_kwargs key this engine applied, with its effective
        value, as {'mcore_kwargs': {...}, ...}. A key given but not listed here FAILs the scenario."""
        return {}

    def effective_dtype(self) -> str | None:
        """The dtype ('fp32' / 'bf16' / 'fp16') this engine ACTUALLY computed in, read back from its own objects
        (parameter or compute dtype, mixed-precision policy, framework config), not from the scenario. A value other
        than the scenario's dtype FAILs it; None = the engine cannot tell."""
        return None

    def optimizer_steps(self) -> int | None:
        """How many optimizer steps the engine actually took, read back from its optimizer's own state (a count
        other than the workload's steps FAILs the scenario); None = the engine cannot tell."""
        return None

    # ---- optional: the engine's own checkpoint (resume and conversion parity) --------------------------------
    def save_checkpoint(self, directory: Path) -> None:
        """Write the engine's OWN checkpoint of everything a run continued from it needs — model, optimizer state
        (Adam's moments and step counts), the learning-rate scheduler — into `directory`, in the framework's format
        (Megatron dist-ckpt, torch DCP, verl's checkpoint manager). Called on every rank after a step; the directory
        exists. A scenario with `resume` or `convert` needs it."""
        raise NotImplementedError(f"{type(self).__name__} does not save checkpoints (Engine.save_checkpoint)")

    def load_checkpoint(self, directory: Path) -> None:
        """Restore, after setup() in FRESH processes (possibly on another layout), what save_checkpoint wrote: the
        next train_step must continue the run as if it had never stopped."""
        raise NotImplementedError(f"{type(self).__name__} does not load checkpoints (Engine.load_checkpoint)")

    @classmethod
    def convert_checkpoint(cls, directory: Path, hf_dir: Path, base: Path, faults: FaultPlan) -> None:
        """Turn a checkpoint save_checkpoint wrote into an HF checkpoint directory (safetensors + config.json) with
        the framework's or the project's converter, in one process and without a process group, as a user runs a
        model merger. `base` is the HF checkpoint the run started from (its config); `faults` the scenario's (a
        converter fault lives here). A scenario with `convert` needs it."""
        raise NotImplementedError(f"{cls.__name__} has no checkpoint converter (Engine.convert_checkpoint)")

    def teardown(self) -> None:  # noqa: B027 - optional hook, most engines need nothing
        """Release process-group state the engine created (the worker destroys the default group)."""
