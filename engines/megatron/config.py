"""Megatron configuration from an HF config + scenario, and the routing of `mcore_kwargs`.

Every `mcore_kwargs` key goes to the Megatron dataclass(es) that declare it (TransformerConfig,
DistributedDataParallelConfig, OptimizerConfig; a field some of them share, like `use_distributed_optimizer`
or `bf16`, goes to each) or to the schedule settings this engine owns. A key none of them declares, or one that
the layout / checkpoint fixes, is not applied: the engine warns and leaves it out of applied_kwargs, so the
harness fails the scenario as "dropped engine kwargs" instead of running something else than asked.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from parity.engines.megatron.convert import ModelArch
from parity.engines.megatron.rules import DEFAULT_MICRO_BATCH_SIZE, expert_tensor_parallel
from parity.engines.specs import MEGATRON
from parity.harness.contract.engine import TORCH_DTYPES
from parity.harness.contract.schema import Layout

_CHECKPOINT = "read from the checkpoint's config, not set by mcore_kwargs"
#: mcore_kwargs keys this engine refuses, and why (the layout-owned ones come from the engine's spec)
RESERVED: dict[str, str] = {
    **{key: f"set by the scenario's {where}, not by mcore_kwargs" for key, where in MEGATRON.layout_keys.items()},
    **dict.fromkeys(("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                     "ffn_hidden_size", "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk", "add_qkv_bias",
                     "qk_layernorm", "normalization", "gated_linear_unit", "activation_func", "add_bias_linear",
                     "layernorm_epsilon"), _CHECKPOINT),
    "apply_rope_fusion": "the engine rotates each row by its own position_ids; the fused RoPE kernels take one "
                         "angle table for all rows",
}

#: settings of the forward/backward schedule call that this engine owns (not in any Megatron dataclass)
SCHEDULE_DEFAULTS: dict[str, Any] = {"micro_batch_size": DEFAULT_MICRO_BATCH_SIZE}


@dataclass(frozen=True, slots=True)
class RoutedKwargs:
    """mcore_kwargs split by destination."""

    transformer: dict[str, Any] = field(default_factory=dict)
    ddp: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    """key -> why it was not applied."""


#: fields that hold a torch.dtype: YAML gives a name ('bfloat16'), Megatron needs the dtype
DTYPE_FIELDS = frozenset({"params_dtype", "pipeline_dtype", "autocast_dtype", "main_grads_dtype",
                          "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"})


def _dtype(key: str, name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"mcore_kwargs.{key}: {name!r} is not a torch dtype name (e.g. 'bfloat16', 'float32')")
    return dtype


def _attn_backend(key: str, name: str) -> enum.Enum:
    """As verl does (verl/utils/megatron_utils.py mapping_string_to_attn_backend: AttnBackend[name]): a string
    left as is never equals the enum Megatron compares with, so 'flash' would silently select nothing."""
    from megatron.core.transformer.enums import AttnBackend

    if name not in AttnBackend.__members__:
        raise ValueError(f"mcore_kwargs.{key}: {name!r} is not an AttnBackend name "
                         f"({', '.join(AttnBackend.__members__)})")
    return AttnBackend[name]


#: fields that hold a Megatron enum: YAML gives its member name
ENUM_FIELDS = {"attention_backend": _attn_backend}


def _fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def route_mcore_kwargs(given: Mapping[str, Any]) -> RoutedKwargs:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    targets = {"transformer": _fields(TransformerConfig), "ddp": _fields(DistributedDataParallelConfig),
               "optimizer": _fields(OptimizerConfig)}
    routed = RoutedKwargs()
    for key, value in given.items():
        if key in DTYPE_FIELDS and isinstance(value, str):
            value = _dtype(key, value)
        if key in ENUM_FIELDS and isinstance(value, str):
            value = ENUM_FIELDS[key](key, value)
        if key in RESERVED:
            routed.rejected[key] = RESERVED[key]
            continue
        if key in SCHEDULE_DEFAULTS:
            routed.schedule[key] = value
            continue
        homes = [name for name, names in targets.items() if key in names]
        if not homes:
            routed.rejected[key] = ("no field of that name in TransformerConfig, DistributedDataParallelConfig, "
                                    "OptimizerConfig or the schedule settings")
        for home in homes:
            getattr(routed, home)[key] = value
    return routed


def readable(value: Any) -> Any:
    """A config value as JSON can hold it (applied_kwargs is written to the run record)."""
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    if isinstance(value, enum.Enum):
        return value.name
    if callable(value):
        return getattr(value, "__name__", repr(value))
    return value


def read_back(key: str, sources: Mapping[str, Any], schedule: Mapping[str, Any]) -> Any:
    """The effective value of one applied key, read from the first config object that has it."""
    if key in schedule:
        return readable(schedule[key])
    for source in sources.values():
        if source is not None and hasattr(source, key):
            return readable(getattr(source, key))
    raise KeyError(key)


def unsupported(hf_config: Any) -> list[str]:
    """What in an HF config this engine would silently get wrong: refused up front instead."""
    text = getattr(hf_config, "text_config", None) or hf_config
    problems = []
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default"
    if rope_type not in (None, "default"):
        problems.append(f"rope_type {rope_type!r} (only plain RoPE is mapped)")
    if getattr(text, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {text.hidden_act!r} (SwiGLU with silu is mapped)")
    if getattr(text, "mlp_bias", False):
        problems.append("mlp_bias (MLP biases are not mapped)")
    if getattr(text, "use_sliding_window", False):
        problems.append("use_sliding_window (sliding-window attention is not mapped)")
    if getattr(text, "shared_expert_intermediate_size", 0):
        problems.append("shared experts (not mapped)")
    return problems


def transformer_kwargs(arch: ModelArch, hf_config: Any, layout: Layout, dtype: str,
                       on_cpu: bool) -> dict[str, Any]:
    """TransformerConfig arguments that reproduce the HF model and the scenario's layout."""
    text = getattr(hf_config, "text_config", None) or hf_config
    params_dtype = TORCH_DTYPES[dtype]
    kwargs: dict[str, Any] = {
        "num_layers": arch.num_layers, "hidden_size": arch.hidden_size, "num_attention_heads": arch.num_heads,
        "num_query_groups": arch.num_kv_heads, "kv_channels": arch.head_dim,
        "ffn_hidden_size": arch.ffn_hidden_size, "normalization": "RMSNorm",
        "layernorm_epsilon": float(text.rms_norm_eps), "gated_linear_unit": True, "activation_func": F.silu,
        "add_bias_linear": False, "add_qkv_bias": arch.qkv_bias, "qk_layernorm": arch.qk_norm,
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "attention_softmax_in_fp32": True,
        "tensor_model_parallel_size": layout.tp, "pipeline_model_parallel_size": layout.pp,
        "virtual_pipeline_model_parallel_size": layout.vpp if layout.vpp > 1 else None,
        "context_parallel_size": layout.cp, "sequence_parallel": layout.sequence_parallel,
        "expert_model_parallel_size": layout.ep,
        "expert_tensor_parallel_size": expert_tensor_parallel(layout),
        "params_dtype": params_dtype, "pipeline_dtype": params_dtype,
        "bf16": dtype == "bf16", "fp16": dtype == "fp16",
        # perform_initialization stays on although the checkpoint overwrites every weight: Megatron sets the
        # `tensor_model_parallel` attributes (which the grad norm uses to skip TP duplicates) only while
        # initialising. Everything fused is CUDA-only or changes numerics.
        "use_cpu_initialization": on_cpu, "perform_initialization": True,
        "masked_softmax_fusion": False, "bias_activation_fusion": False, "bias_dropout_fusion": False,
        "apply_rope_fusion": False, "gradient_accumulation_fusion": False, "persist_layer_norm": False,
        # the loss function divides by the GLOBAL token count itself; Megatron must not rescale
        "calculate_per_token_loss": True,
    }
    if arch.num_experts:
        kwargs.update(_moe_kwargs(arch, text))
    if on_cpu:
        from parity.engines.megatron.cpu_compat import config_overrides

        kwargs.update(config_overrides())
    return kwargs


def _moe_kwargs(arch: ModelArch, text: Any) -> dict[str, Any]:
    """Match HF's routing: softmax over all experts, top-k, renormalise (Mixtral always, Qwen3-MoE when
    norm_topk_prob) == softmax over the top-k logits, which is Megatron's default (pre_softmax False).
    Without renormalisation the probabilities are the pre-softmax ones. No aux loss, no capacity drop."""
    normalise = arch.model_type == "mixtral" or bool(getattr(text, "norm_topk_prob", True))
    kwargs: dict[str, Any] = {
        "num_moe_experts": arch.num_experts, "moe_ffn_hidden_size": arch.moe_ffn_hidden_size,
        "moe_router_topk": int(text.num_experts_per_tok), "moe_router_pre_softmax": not normalise,
        "moe_router_score_function": "softmax", "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0, "moe_z_loss_coeff": None, "moe_grouped_gemm": False,
        "moe_token_dispatcher_type": "allgather", "moe_permute_fusion": False,
    }
    if not all(arch.moe_layers):
        kwargs["moe_layer_freq"] = [int(m) for m in arch.moe_layers]
    return kwargs
