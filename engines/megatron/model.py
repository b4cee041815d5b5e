"""The Megatron-Core GPTModel chunks of one rank: layer spec, explicit-position RoPE, HF weights loaded in."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel, gpt_layer_specs
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from parity.engines.megatron import compat
from parity.engines.megatron.convert import ModelArch, Shard, grouped_expert_name, hf_to_mcore, te_name


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except Exception:  # not installed, or installed without its CUDA libraries
        return False
    return True


class PositionalGPTModel(GPTModel):
    """GPTModel whose RoPE angles come from the batch's position_ids, as HF computes them.

    Stock Megatron rotates by 0..S-1; with left-padded prompts HF's positions start at each row's first real
    token. Attention only sees position differences, so both agree in exact arithmetic, but computing the same
    angles as HF keeps the comparison at rounding level. The angles are swapped in where every release asks for
    them — the `rotary_pos_emb` call (inline in `forward` up to 0.12, in `_preprocess` from 0.13) — so the
    forward step passes the WHOLE [b, s] position_ids and the per-rank CP slice is Megatron's own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._positions: torch.Tensor | None = None
        if self.position_embedding_type == "rope":
            self.rotary_pos_emb.forward = self._rope_angles  # this instance only

    def forward(self, input_ids: Any, position_ids: Any, *args: Any, **kwargs: Any) -> Any:
        # packed (THD): positions restart per sequence, which is what Megatron's own THD RoPE computes from
        # cu_seqlens (its per-sequence, per-CP-rank slices): left to it
        self._positions = None if kwargs.get("packed_seq_params") is not None else position_ids
        try:
            return super().forward(input_ids, position_ids, *args, **kwargs)
        finally:
            self._positions = None

    def _rope_angles(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        rope = self.rotary_pos_emb
        if self._positions is None:
            return type(rope).forward(rope, *args, **kwargs)
        inv_freq = rope.inv_freq.to(self._positions.device)
        freqs = self._positions.float()[..., None] * inv_freq  # [b, s, d/2]
        emb = torch.cat([freqs, freqs], dim=-1).transpose(0, 1)[:, :, None, :]  # [s, b, 1, d]
        cp_group = parallel_state.get_context_parallel_group()
        if cp_group.size() > 1:
            emb = compat.pos_emb_on_this_cp_rank(emb, 0, cp_group)
        return emb


def layer_spec(config: TransformerConfig, use_te: bool, vp_stage: int | None, cp_attention: type | None,
               arbitrary_mask: bool = True) -> Any:
    """Decoder block spec: TE, or the local spec (torch RMSNorm, local attention) whose core attention
    becomes `cp_attention` when given (Megatron's local attention refuses CP and packed sequences).
    `arbitrary_mask`: the TE spec takes the engine's full mask (padded rows), else its causal default (THD)."""
    build = gpt_layer_specs.get_gpt_decoder_block_spec
    block = build(config, use_transformer_engine=use_te, normalization=config.normalization,
                  **compat.vp_stage_kwargs(build, vp_stage))
    for spec in {id(s): s for s in block.layer_specs}.values():
        attention = spec.submodules.self_attention
        if use_te and arbitrary_mask:
            # left-padded prompts: TE's padding masks assume right padding, so pass the full mask
            attention.params = {**attention.params, "attn_mask_type": AttnMaskType.arbitrary}
        elif cp_attention is not None:
            attention.submodules.core_attention = cp_attention
    return block


def build_chunks(config: TransformerConfig, arch: ModelArch, rope_theta: float, use_te: bool,
                 cp_attention: type | None, max_seq_len: int, arbitrary_mask: bool = True) -> list[GPTModel]:
    """One GPTModel per virtual pipeline stage of this rank."""
    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size()
    chunks = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp else None
        with compat.building_stage(stage):
            chunks.append(PositionalGPTModel(
                config=config,
                transformer_layer_spec=layer_spec(config, use_te, stage, cp_attention, arbitrary_mask),
                vocab_size=arch.padded_vocab_size, max_sequence_length=max_seq_len,
                pre_process=compat.is_first_stage(stage), post_process=compat.is_last_stage(stage),
                parallel_output=True, share_embeddings_and_output_weights=arch.tied,
                position_embedding_type="rope", rotary_percent=1.0, rotary_base=rope_theta,
                **compat.vp_stage_kwargs(GPTModel.__init__, stage)))
    return chunks


def current_shard() -> Shard:
    ps = parallel_state
    return Shard(tp_size=ps.get_tensor_model_parallel_world_size(), tp_rank=ps.get_tensor_model_parallel_rank(),
                 ep_size=ps.get_expert_model_parallel_world_size(), ep_rank=ps.get_expert_model_parallel_rank(),
                 etp_size=ps.get_expert_tensor_parallel_world_size(), etp_rank=ps.get_expert_tensor_parallel_rank())


def layer_map(chunk: GPTModel) -> dict[int, int]:
    """Local layer index -> global layer index, from Megatron's own 1-based `layer_number` (PP/VPP offsets)."""
    return {local: layer.layer_number - 1 for local, layer in enumerate(chunk.decoder.layers)}


@torch.no_grad()
def load_hf_weights(chunk: GPTModel, hf: Mapping[str, torch.Tensor], arch: ModelArch, shard: Shard,
                    wrong_qkv_interleave: bool = False) -> dict[torch.nn.Parameter, torch.Tensor]:
    """Copy this chunk's share of the HF checkpoint into it; every parameter must be covered exactly once.

    Returns, for each 16-bit parameter whose checkpoint tensor has another dtype (bf16 params from an fp32
    checkpoint), the unrounded tensor: `load_main_params` puts it into the optimizer's fp32 main params."""
    tensors = hf_to_mcore(hf, arch, shard, layer_map(chunk), chunk.pre_process, chunk.post_process,
                          wrong_qkv_interleave)
    params = dict(chunk.named_parameters())
    wider: dict[torch.nn.Parameter, torch.Tensor] = {}
    loaded = set()
    for name, tensor in tensors.items():
        target = next((n for n in (name, te_name(name), grouped_expert_name(name)) if n in params), None)
        if target is None:
            raise KeyError(f"converted weight {name} has no parameter in the Megatron model")
        param = params[target]
        if param.shape != tensor.shape:
            raise ValueError(f"{target}: converted shape {tuple(tensor.shape)} != parameter {tuple(param.shape)}")
        param.copy_(tensor.to(param.dtype))
        if param.dtype in (torch.bfloat16, torch.float16) and tensor.dtype != param.dtype:
            wider[param] = tensor.clone()  # not a view that keeps the whole checkpoint tensor alive
        loaded.add(target)
    missing = sorted(set(params) - loaded)
    if missing:
        raise KeyError(f"Megatron parameters not loaded from the checkpoint: {missing}")
    return wider


@torch.no_grad()
def load_main_params(optimizer: Any, sources: Mapping[torch.nn.Parameter, torch.Tensor]) -> int:
    """Give the optimizer's fp32 main params the checkpoint's own values instead of their 16-bit rounding;
    returns how many main params (or distributed-optimizer shards) were set.

    Megatron's bf16 / fp16 optimizers create their fp32 main params as copies of the model params, which hold
    the checkpoint rounded to 16 bits (each off by up to half a ulp). Started from there, every update smaller
    than half a ulp is lost, while fp32 main params with the exact values — spread uniformly inside their
    ulp — move the 16-bit weight by one ulp with probability |update| / ulp, so the model follows the update
    on average. The exact values are the state a resume restores (Megatron checkpoints hold the fp32 main
    params) and the one the `hf_master_weights` baseline starts from.

    Each 16-bit model param points at its main param (`param.main_param`, set by both
    Float16OptimizerWithFloat16Params and DistributedOptimizer); the distributed optimizer's is this rank's
    shard (`main_param_sharded`, None where another rank owns the param), whose range in the flattened param
    its optimizer records. (Swapping `param.data` to the fp32 tensor for `reload_model_params` would be
    shorter, but a dtype change resets the param's grad accumulator and with it DDP's backward hook.)"""
    optimizers = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    done = 0
    for param, source in sources.items():
        main = getattr(param, "main_param", None)
        if main is None:
            continue
        if getattr(param, "main_param_sharded", False):
            owner = next(o for o in optimizers if param in getattr(o, "model_param_gbuf_map", {}))
            span = owner._get_model_param_range_map(param)["param"]
            main.copy_(source.reshape(-1)[span.start:span.end])
        else:
            main.copy_(source)
        done += 1
    return done
