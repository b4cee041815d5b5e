"""Experts for verl's Megatron engine on CPU, under mbridge's names.

mbridge maps the experts of a MoE model only in Transformer Engine's grouped layout: `mlp.experts.linear_fc1.weight<j>`
for local expert j (mbridge/core/bridge.py load_weights and `_weight_name_mapping_mcore_local_to_global`, which
split the name at `.weight`), the names of Megatron's TEGroupedMLP over TE's GroupedLinear. Megatron's local spec
builds SequentialMLP (`local_experts.<j>.linear_fc1.weight`) or, with mbridge's `moe_grouped_gemm=True`, the legacy
GroupedMLP, which needs the grouped_gemm CUDA package. So on CPU the experts are Megatron's own TEGroupedMLP over
a plain-torch grouped linear with TE's parameter names and TE's expert-parallel conventions as megatron-core's
wrapper sets them up (megatron/core/extensions/transformer_engine.py TEGroupedLinear: with expert parallelism or
expert TP the communication is the token dispatcher's, so the linear holds its expert-TP slice and runs no
collective; every weight carries `allreduce = not (is_expert and ep > 1)`), and TE's own marking of every weight as a
tensor-parallel shard (transformer_engine/pytorch/module/grouped_linear.py GroupedLinear.reset_parameters:
`tensor_model_parallel`, partition dim 1 for a row-parallel linear, else 0). Megatron's grad norm reads that mark
(megatron/core/optimizer/optimizer.py get_main_grads_for_grad_norm against the TP group): an unmarked expert weight
on TP rank 1 counts as TP rank 0's copy, and under tp > etp that rank's experts drop out of the norm and its clip.
MindSpeed's NPU stand-in (mindspeed/te/pytorch/module/grouped_linear.py) does the same with npu_grouped_matmul.
"""

from __future__ import annotations

from typing import Any

import torch


class CpuGroupedLinear(torch.nn.Module):
    """One [out, in] weight per local expert (`weight<j>`); forward(x, tokens_per_expert) multiplies each expert's
    consecutive rows of x by its weight, as TE's GroupedLinear does."""

    parallel_mode: str

    def __init__(self, num_gemms: int, input_size: int, output_size: int, *, config: Any, init_method: Any,
                 bias: bool, skip_bias_add: bool, is_expert: bool, tp_comm_buffer_name: str | None = None,
                 pg_collection: Any = None) -> None:
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

        super().__init__()
        if bias:
            raise NotImplementedError("expert biases: mbridge's MoE models have none, and this stand-in has none")
        if not is_expert:
            raise ValueError("TEGroupedLinear only supports expert parallelism")  # as megatron-core asserts
        group = getattr(pg_collection, "expt_tp", None) if pg_collection is not None else None
        tp = group.size() if group is not None else parallel_state.get_expert_tensor_parallel_world_size()
        expert_parallel = config.expert_model_parallel_size > 1
        if tp > 1 or expert_parallel:  # explicit expert communication: this rank's expert-TP slice
            if self.parallel_mode == "column":
                output_size //= tp
            else:
                input_size //= tp
        self.num_gemms = num_gemms
        for j in range(num_gemms):
            weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            if config.perform_initialization:
                init_method(weight)
            weight.allreduce = not expert_parallel  # type: ignore[attr-defined]
            set_tensor_model_parallel_attributes(weight, is_parallel=True, dim=1 if self.parallel_mode == "row" else 0,
                                                 stride=1)
            self.register_parameter(f"weight{j}", weight)

    def forward(self, x: torch.Tensor, tokens_per_expert: list[int]) -> tuple[torch.Tensor, None]:
        pieces = torch.split(x, list(tokens_per_expert))
        out = [piece @ getattr(self, f"weight{j}").t() for j, piece in enumerate(pieces)]
        return torch.cat(out), None


class CpuColumnGroupedLinear(CpuGroupedLinear):
    parallel_mode = "column"


class CpuRowGroupedLinear(CpuGroupedLinear):
    parallel_mode = "row"


def grouped_experts(block: Any) -> Any:
    """The decoder block spec with every MoE layer's experts as Megatron's TEGroupedMLP over the CPU grouped
    linears (a dense layer is left as it is)."""
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import TEGroupedMLP
    from megatron.core.transformer.spec_utils import ModuleSpec

    experts = ModuleSpec(module=TEGroupedMLP, submodules=MLPSubmodules(linear_fc1=CpuColumnGroupedLinear,
                                                                       linear_fc2=CpuRowGroupedLinear))
    for spec in {id(s): s for s in block.layer_specs}.values():
        mlp = spec.submodules.mlp
        if hasattr(getattr(mlp, "submodules", None), "experts"):
            mlp.submodules.experts = experts
    return block
