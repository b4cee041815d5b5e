"""The project's Megatron -> HF converter for the engine's own checkpoint: a Megatron dist-ckpt (torch_dist format,
written by MegatronEngine.save_checkpoint on any layout) read in ONE process, without a process group or Megatron,
and mapped to HF tensors by convert.mcore_to_hf.

A dist-ckpt stores every model tensor whole, as the global tensor its TP / EP shards are pieces of (Megatron's
ShardedTensors: megatron/core/dist_checkpointing/mapping.py): a TP-split linear as the concatenation of its shards
(linear_qkv group after group, linear_fc1 as [gate; up] of the whole width: megatron/core/transformer/mlp.py
apply_swiglu_sharded_factory), the decoder's layers stacked on a leading axis of the global layer index, experts on
one of the global expert index, the input norms under Transformer Engine's fused names (the local spec maps them
there when it saves). So the whole checkpoint is one TP=1 piece of the model for convert.mcore_to_hf.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from parity.engines.megatron.convert import McorePiece, ModelArch, Shard, local_name, mcore_to_hf

#: a dist-ckpt key of a tensor that belongs to the optimizer or scheduler, or Transformer Engine's extra state
_NOT_MODEL = re.compile(r"^(optimizer|opt_param_scheduler|rng_state)|_extra_state")
_EXPERTS = re.compile(r"^mlp\.experts\.(?:experts\.)?(linear_fc[12])\.weight$")


def read_model_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every model tensor of a torch_dist dist-ckpt, whole, read in this process (torch DCP without a group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(str(directory))
    metadata = reader.read_metadata()
    tensors = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
               for key, meta in metadata.state_dict_metadata.items()
               if isinstance(meta, TensorStorageMetadata) and not _NOT_MODEL.search(key)}
    dcp.load(tensors, storage_reader=reader, no_dist=True)
    return tensors


def as_piece(tensors: dict[str, torch.Tensor], arch: ModelArch) -> McorePiece:
    """The global tensors as one TP=1 / EP=1 piece in the names convert.hf_to_mcore gives a chunk."""
    state: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        if not key.startswith("decoder.layers."):
            state[key] = tensor
            continue
        rest = local_name(key[len("decoder.layers."):])
        if tensor.shape[0] != arch.num_layers:
            raise ValueError(f"dist-ckpt tensor {key} {tuple(tensor.shape)}: expected the {arch.num_layers} layers "
                             "stacked on its first axis")
        for layer in range(arch.num_layers):
            if not arch.is_moe(layer) and rest.startswith("mlp.router"):
                continue
            experts = _EXPERTS.match(rest)
            if experts:
                for expert in range(arch.num_experts):
                    state[f"decoder.layers.{layer}.mlp.experts.local_experts.{expert}.{experts.group(1)}.weight"] = \
                        tensor[layer, expert]
            else:
                state[f"decoder.layers.{layer}.{rest}"] = tensor[layer]
    return McorePiece(shard=Shard(), layers={i: i for i in range(arch.num_layers)}, state=state)


def dist_ckpt_to_hf(directory: Path, hf_dir: Path, base: Path, faults: Any) -> None:
    """Convert; `base` is the HF checkpoint the run started from (its config). Faults: converter_qk_swap (q and k
    of each KV group exchanged), converter_tied_embedding_dropped (the converted config unties the embedding and no
    lm_head is written: transformers then initialises one)."""
    import transformers

    from parity.engines.hf.common import hf_state_to_checkpoint

    config = transformers.AutoConfig.from_pretrained(base)
    arch = ModelArch.from_hf_config(config)
    hf = mcore_to_hf([as_piece(read_model_tensors(directory), arch)], arch, expert_format="fused",
                     qk_swapped=bool(faults.active("converter_qk_swap")))
    if faults.active("converter_tied_embedding_dropped") and arch.tied:
        config.tie_word_embeddings = False
        hf.pop("lm_head.weight", None)
    hf_state_to_checkpoint(hf, config, hf_dir)
