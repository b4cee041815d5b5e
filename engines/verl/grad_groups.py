"""Per-module gradient fingerprints of verl's engines, as the harness's own engines report them
(parity.harness.contract.grad_groups: the pre-clip grad norm of every HF parameter group, whole over the ranks),
read from the model verl built at the moment verl's engine steps its optimizer.

verl's `BaseEngine.train_batch` runs `forward_backward_batch` then `optimizer_step` (verl/workers/engine/base.py);
by the time `optimizer_step` is entered the gradients are reduced and not yet clipped (the FSDP engine clips inside
it, verl/workers/engine/fsdp/transformer_impl.py `optimizer_step`; Megatron's optimizer inside `optimizer.step()`,
after the schedule's finalize_model_grads). The engine instance's `optimizer_step` is wrapped: it reads the
groups, then calls verl's method unchanged. The planted `module_grad_scale` fault scales one group's gradients in
verl's model right there, as a module-local gradient bug in verl's backward would.

- FSDP2: every parameter's gradient is a DTensor shard; each norm is reduced over its own mesh
  (engines/tensor_parallel.py `group_grad_norms`). FSDP1 flattens parameters (verl builds it without
  `use_orig_params` by default): no per-module names, no groups (not compared).
- Megatron: the DDP `main_grad` buffers (engines/megatron/grad_groups.py), whole or, under the distributed
  optimizer (verl's default), each data-parallel rank's reduce-scattered slice.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from parity.harness.contract.engine import StepOutput
from parity.harness.contract.grad_groups import hf_group
from parity.harness.contract.workload import Batch


class GradGroups:
    """Mixin for a VerlEngine: reports StepOutput.group_grad_norms for each harness step. Backends say how the
    groups are read (`read_grad_groups`) and which gradients a planted fault scales (`named_grads`)."""

    _groups_per_optimizer_step: list[dict[str, float] | None]
    _groups_step: int = 0

    def setup(self) -> None:
        super().setup()  # type: ignore[misc]
        self._groups_per_optimizer_step = []
        engine = self.engine  # type: ignore[attr-defined]
        optimizer_step = engine.optimizer_step

        @functools.wraps(optimizer_step)
        def fingerprinted(*args: Any, **kwargs: Any) -> Any:
            faults = self.ctx.faults  # type: ignore[attr-defined]
            faults.scale_group_grads(self.named_grads(), self.group_of, self._groups_step)
            self._groups_per_optimizer_step.append(self.read_grad_groups())
            return optimizer_step(*args, **kwargs)

        engine.optimizer_step = fingerprinted

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput | None:
        self._groups_step = step
        seen = len(self._groups_per_optimizer_step)
        out = super().train_step(batch, old_logprobs, step)  # type: ignore[misc]
        taken = self._groups_per_optimizer_step[seen:]
        # one fingerprint per harness step; a step of several optimizer steps (mini-batches) has none to compare
        if out is None or len(taken) != 1 or taken[0] is None:
            return out
        return dataclasses.replace(out, group_grad_norms=taken[0])

    def named_grads(self) -> list[tuple[str, Any]]:
        """(name, gradient as it is stored) of every trainable parameter, in the naming `group_of` reads."""
        raise NotImplementedError

    def group_of(self, name: str) -> str:
        """The HF group of a name `named_grads` gives."""
        return hf_group(name)

    def read_grad_groups(self) -> dict[str, float] | None:
        """The whole-model group norms (collective over the world), or None where this build reports none."""
        raise NotImplementedError
