"""Megatron parameter names -> the HF parameter groups of parity.harness.contract.grad_groups, and the per-group
pre-clip grad norms over Megatron's DDP `main_grad` buffers, whole over the model.

Every unique gradient piece counts once, as Megatron's own norm counts it: a dense parameter on the ranks of
dp x cp coordinate 0, TP-sharded ones on every TP rank, TP-replicated ones (norms, router) on TP rank 0; an expert
parameter on expert-data-parallel rank 0 (each expert-TP x EP position holds a distinct shard); the pipeline
stages' groups are gathered; a tied output weight on the last stage (`shared`) is the embedding's copy.

Under the distributed optimizer the grad buffers are reduce-scattered: each rank of a bucket's data-parallel group
holds the reduced values of its own 1/n slice of the bucket only (megatron/core/distributed/param_and_grad_buffer.py
start_grad_sync: `shard_buffer(bucket.grad_data, ...)[rank]`), so each parameter's square is summed over the part of
it that falls in this rank's slice, on every data-parallel rank (`sharded_group_grad_norms`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from parity.harness.contract import grad_groups

_PREFIX = re.compile(r"^(?:module\.)+")
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
#: (pattern on the part of a layer's parameter name after `decoder.layers.j.`, HF group suffix)
LAYER_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), g) for p, g in (
    (r"^self_attention\.linear_qkv\.layer_norm_", "input_layernorm"),  # TE fuses the norm into linear_qkv
    (r"^mlp\.linear_fc1\.layer_norm_", "post_attention_layernorm"),
    (r"^input_layernorm\.", "input_layernorm"),
    (r"^pre_mlp_layernorm\.", "post_attention_layernorm"),
    (r"^self_attention\.linear_qkv\.", "self_attn.qkv"),
    (r"^self_attention\.linear_proj\.", "self_attn.o_proj"),
    (r"^self_attention\.q_layernorm\.", "self_attn.q_norm"),
    (r"^self_attention\.k_layernorm\.", "self_attn.k_norm"),
    (r"^mlp\.router\.", "mlp.router"),
    (r"^mlp\.experts\.", "mlp.experts"),
    (r"^mlp\.shared_experts\.", "mlp.shared_experts"),
    (r"^mlp\.linear_fc1\.", "mlp.gate_up"),
    (r"^mlp\.linear_fc2\.", "mlp.down_proj"),
))
TOP_RULES = {"embedding.word_embeddings.": "embed_tokens", "decoder.final_layernorm.": "norm",
             "output_layer.": "lm_head"}


def mcore_group(name: str, global_layer: int | None) -> str:
    """The HF group of a Megatron parameter name (`global_layer`: 0-based HF index of its decoder layer)."""
    name = _PREFIX.sub("", name)
    for prefix, group in TOP_RULES.items():
        if name.startswith(prefix):
            return group
    if (match := _LAYER.match(name)) and global_layer is not None:
        for pattern, suffix in LAYER_RULES:
            if pattern.match(match.group(2)):
                return f"layers.{global_layer}.{suffix}"
    return name.rsplit(".", 1)[0]


def named_main_grads(chunks: Iterable[torch.nn.Module]) -> Iterator[tuple[str, str, torch.nn.Parameter]]:
    """(name, HF group, param) of every trainable parameter of this rank's model chunks; a decoder layer's local
    index is turned into its global one through its `layer_number` (1-based, global)."""
    for chunk in chunks:
        layer_of = {}
        for module_name, module in chunk.named_modules():
            local = re.search(r"decoder\.layers\.(\d+)$", module_name)
            if local and hasattr(module, "layer_number"):
                layer_of[_PREFIX.sub("", module_name)] = int(module.layer_number) - 1
        for name, param in chunk.named_parameters():
            if not param.requires_grad:
                continue
            bare = _PREFIX.sub("", name)
            match = _LAYER.match(bare)
            layer = layer_of.get(f"decoder.layers.{match.group(1)}") if match else None
            yield name, mcore_group(bare, layer), param


def _counts_here(name: str, param: Any) -> bool:
    """Whether this rank holds the copy of this gradient piece that counts (see the module docstring)."""
    from megatron.core import parallel_state as ps

    if getattr(param, "shared", False):
        return False
    if ".experts." in name and ".shared_experts." not in name:
        rank_of = getattr(ps, "get_expert_data_parallel_rank", None) or ps.get_data_modulo_expert_parallel_rank
        return rank_of() == 0
    if ps.get_data_parallel_rank(with_context_parallel=True) != 0:
        return False
    return bool(getattr(param, "tensor_model_parallel", False)) or ps.get_tensor_model_parallel_rank() == 0


def _gathered_norms(squares: dict[str, float]) -> dict[str, float]:
    gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, squares)
    total: dict[str, float] = {}
    for part in gathered:
        for group, value in part.items():
            total[group] = total.get(group, 0.0) + value
    return grad_groups.norms(total)


def _shard_squares(chunk: Any) -> dict[int, float]:
    """id(param) -> the squared norm of the part of its reduced gradient this rank holds under the distributed
    optimizer: its slice of every bucket, located through `main_grad`, a view into the bucket's `grad_data`."""
    squares: dict[int, float] = {}
    for bucket_group in [*chunk.bucket_groups, *chunk.expert_parallel_bucket_groups]:
        ranks = bucket_group.intra_distributed_optimizer_instance_size
        rank = bucket_group.intra_distributed_optimizer_instance_rank
        for bucket in bucket_group.buckets:
            data = bucket.grad_data
            shard = data.numel() // ranks
            low, high = rank * shard, (rank + 1) * shard
            for param in bucket.params_list:
                start = (param.main_grad.data_ptr() - data.data_ptr()) // data.element_size()
                begin, end = max(low, start), min(high, start + param.numel())
                if begin < end:
                    norm = float(torch.linalg.vector_norm(data[begin:end], 2.0, dtype=torch.float32))
                    squares[id(param)] = squares.get(id(param), 0.0) + norm * norm
    return squares


@torch.no_grad()
def sharded_group_grad_norms(chunks: Iterable[torch.nn.Module]) -> dict[str, float]:
    """group_grad_norms under the distributed optimizer (module docstring): every data-parallel rank's slice
    counts, TP-replicated pieces on TP rank 0 only (collective over the world)."""
    from megatron.core import parallel_state as ps

    chunks = list(chunks)
    held: dict[int, float] = {}
    for chunk in chunks:
        held |= _shard_squares(chunk)
    squares: dict[str, float] = {}
    tp_rank = ps.get_tensor_model_parallel_rank()
    for name, group, param in named_main_grads(chunks):
        if getattr(param, "shared", False) or id(param) not in held:
            continue
        expert = ".experts." in name and ".shared_experts." not in name
        if expert or getattr(param, "tensor_model_parallel", False) or tp_rank == 0:
            squares[group] = squares.get(group, 0.0) + held[id(param)]
    return _gathered_norms(squares)


@torch.no_grad()
def group_grad_norms(chunks: Iterable[torch.nn.Module]) -> dict[str, float]:
    """Whole-model pre-clip grad norm per HF group from the reduced `main_grad` buffers (call after the schedule's
    finalize_model_grads, before the optimizer step; collective over the world)."""
    squares: dict[str, float] = {}
    for name, group, param in named_main_grads(chunks):
        grad = getattr(param, "main_grad", None)
        if grad is not None and _counts_here(name, param):
            grad_groups.add_squares(squares, group, grad)
    return _gathered_norms(squares)
