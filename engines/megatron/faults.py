"""The Megatron-specific faults: defects a real Megatron integration can have, injected on purpose.

- tp_allreduce_skip: one layer's row-parallel attention output is not reduced over TP (each rank keeps its
  partial sum). Patched on that module instance only, on every rank of the TP group (skipping a collective on one
  rank alone would hang its peers), so nothing outlives the run.
- pp_stage_grad_scale: the gradients of one pipeline stage are scaled on one step.
- qkv_interleave: handled by the weight mapping (`convert.fuse_qkv(wrong_interleave=True)`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from parity.engines.megatron import compat
from parity.harness.contract.faults import FaultPlan


def skip_row_parallel_reduce(linear: Any) -> None:
    """Make this RowParallelLinear return its local partial product instead of the TP-reduced one."""
    from megatron.core.tensor_parallel.mappings import _split_along_first_dim

    original = linear.forward

    def forward(input_: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        linear.explicit_expert_comm = True  # RowParallelLinear's own switch for "caller reduces"
        try:
            output, bias = original(input_, *args, **kwargs)
        finally:
            linear.explicit_expert_comm = False
        if linear.sequence_parallel:  # the reduce-scatter would also have split the sequence
            output = _split_along_first_dim(output, group=compat.tp_group_of(linear))
        return output, bias

    linear.forward = forward


def apply_tp_allreduce_skip(plan: FaultPlan, chunks: Iterable[Any]) -> bool:
    """Patch the first decoder layer (global layer 0) if the scenario asks for it; True if patched here."""
    if not plan.has("tp_allreduce_skip"):
        return False
    for chunk in chunks:
        for layer in chunk.decoder.layers:
            if layer.layer_number == 1:
                skip_row_parallel_reduce(layer.self_attention.linear_proj)
                return True
    return False


def stage_grad_factor(plan: FaultPlan, step: int, pp_rank: int, pp_size: int, world_size: int) -> float:
    """pp_stage_grad_scale: fault.factor for the ranks of the faulty stage on fault.step, else 1.

    The stage is the one holding `fault.rank` (pp is the outermost dimension of Megatron's default rank order),
    or the last stage when no rank is given. Every rank of that stage applies it, whichever rank asked."""
    for fault in plan.faults:
        if fault.kind != "pp_stage_grad_scale" or (fault.step is not None and fault.step != step):
            continue
        stage = pp_size - 1 if fault.rank is None else fault.rank // (world_size // pp_size)
        if stage == pp_rank:
            return fault.factor
    return 1.0
