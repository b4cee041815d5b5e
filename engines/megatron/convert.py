"""HF <-> Megatron-Core weight mapping for Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral decoders.

Pure tensor functions: no process group, no Megatron import, so the round trip HF -> Megatron -> HF is testable
on its own. One rank's Megatron state is described by a `Shard` (its TP / EP / expert-TP coordinates) and a layer
map {local layer index -> global layer index}, which is how PP and VPP offsets enter (the engine reads the global
index from `layer.layer_number`). The same mapping maps gradients.

Megatron layouts (local layer spec; TE fuses the two input norms into the following linear, see `te_name`, and
grouped-GEMM experts name their weights per fc, see `grouped_expert_name`):
- linear_qkv rows are grouped per KV head: [q (heads/groups * d); k (d); v (d)] for each group; TP splits groups.
- linear_fc1 = [gate; up] per TP shard; linear_proj / linear_fc2 split by columns; embeddings split by rows
  after padding the vocabulary.
- experts: rank ep_rank holds experts [ep_rank * E/ep, (ep_rank+1) * E/ep); expert TP splits like dense fc1/fc2.
HF experts come in three spellings, all read: transformers 5 in memory (`mlp.experts.gate_up_proj` [E, 2F, H],
`mlp.experts.down_proj` [E, H, F]), per-expert modules (`mlp.experts.{e}.gate_proj`, what transformers 5 still
writes to disk) and Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from parity.harness.contract.hf_config import expert_count

ExpertFormat = Literal["per_expert", "fused"]
LayerMap = Mapping[int, int]
"""Local layer index (position in this chunk's `decoder.layers`) -> global layer index (0-based)."""


@dataclass(frozen=True, slots=True)
class ModelArch:
    """What the mapping needs to know about one HF decoder; built from its config by `from_hf_config`."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    """Megatron pads the vocabulary so TP divides it; the pad rows are zeros and their logits are dropped."""
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    moe_layers: tuple[bool, ...] = ()
    """Per layer: True where the MLP is a mixture of experts."""

    @classmethod
    def from_hf_config(cls, config: Any, vocab_divisor: int = 1) -> ModelArch:
        text = getattr(config, "text_config", None) or config
        model_type = str(getattr(text, "model_type", ""))
        heads = int(text.num_attention_heads)
        layers = int(text.num_hidden_layers)
        experts = expert_count(text)
        moe_layers: tuple[bool, ...] = ()
        moe_ffn = 0
        if experts:
            step = int(getattr(text, "decoder_sparse_step", 1) or 1)
            dense_only = set(getattr(text, "mlp_only_layers", None) or ())
            moe_layers = tuple(i not in dense_only and (i + 1) % step == 0 for i in range(layers))
            moe_ffn = int(getattr(text, "moe_intermediate_size", None) or text.intermediate_size)
        vocab = int(text.vocab_size)
        return cls(
            model_type=model_type, num_layers=layers, hidden_size=int(text.hidden_size), num_heads=heads,
            num_kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(text, "head_dim", None) or int(text.hidden_size) // heads),
            ffn_hidden_size=int(text.intermediate_size), vocab_size=vocab,
            padded_vocab_size=-(-vocab // vocab_divisor) * vocab_divisor,
            tied=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(getattr(text, "attention_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            num_experts=experts, moe_ffn_hidden_size=moe_ffn, moe_layers=moe_layers)

    def with_vocab_divisor(self, divisor: int) -> ModelArch:
        return replace(self, padded_vocab_size=-(-self.vocab_size // divisor) * divisor)

    def is_moe(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]


@dataclass(frozen=True, slots=True)
class Shard:
    """One rank's coordinates in the groups that split weights."""

    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1
    ep_rank: int = 0
    etp_size: int = 1
    etp_rank: int = 0


# ---- small tensor helpers ----------------------------------------------------------------------------
def _part(tensor: torch.Tensor, parts: int, index: int, dim: int = 0) -> torch.Tensor:
    if tensor.shape[dim] % parts:
        raise ValueError(f"dimension {dim} of shape {tuple(tensor.shape)} does not split into {parts} parts")
    return tensor.chunk(parts, dim)[index].contiguous()


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: ModelArch,
             wrong_interleave: bool = False) -> torch.Tensor:
    """[q; k; v] regrouped per KV head, as Megatron's linear_qkv stores it (weights [.., H] or biases).
    `wrong_interleave` is the qkv_interleave fault: plain concatenation, the classic conversion bug."""
    if wrong_interleave:
        return torch.cat([q, k, v])
    groups, d = arch.num_kv_heads, arch.head_dim
    rest = q.shape[1:]
    per_group = torch.cat([q.reshape(groups, -1, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)],
                          dim=1)
    return per_group.reshape(-1, *rest)


def split_qkv(fused: torch.Tensor, arch: ModelArch,
              qk_swapped: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `fuse_qkv`. `qk_swapped` is the converter_qk_swap fault: each KV group's block read as [k; q; v]
    (q and k exchanged; the shapes still fit, so loading cannot refuse it)."""
    groups, d = arch.num_kv_heads, arch.head_dim
    q_rows = arch.num_heads // groups * d
    rest = fused.shape[1:]
    per_group = fused.reshape(groups, q_rows + 2 * d, *rest)
    if qk_swapped:
        k, q, v = per_group.split([d, q_rows, d], dim=1)
    else:
        q, k, v = per_group.split([q_rows, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _fc1(gate: torch.Tensor, up: torch.Tensor, parts: int, index: int) -> torch.Tensor:
    return torch.cat([_part(gate, parts, index), _part(up, parts, index)])


# ---- HF names ----------------------------------------------------------------------------------------
def _hf_layer(i: int) -> str:
    return f"model.layers.{i}"


def _router_key(hf: Mapping[str, torch.Tensor], i: int) -> str:
    for key in (f"{_hf_layer(i)}.mlp.gate.weight", f"{_hf_layer(i)}.block_sparse_moe.gate.weight"):
        if key in hf:
            return key
    raise KeyError(f"no router weight for layer {i} (looked for mlp.gate / block_sparse_moe.gate)")


def hf_expert(hf: Mapping[str, torch.Tensor], i: int, expert: int) -> tuple[torch.Tensor, ...]:
    """(gate [F, H], up [F, H], down [H, F]) of one expert, whichever way the checkpoint spells experts."""
    base = _hf_layer(i)
    fused = f"{base}.mlp.experts.gate_up_proj"
    if fused in hf:
        gate_up = hf[fused][expert]
        gate, up = gate_up.chunk(2, dim=0)
        return gate, up, hf[f"{base}.mlp.experts.down_proj"][expert]
    qwen = f"{base}.mlp.experts.{expert}"
    if f"{qwen}.gate_proj.weight" in hf:
        return tuple(hf[f"{qwen}.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
    mixtral = f"{base}.block_sparse_moe.experts.{expert}"
    if f"{mixtral}.w1.weight" in hf:
        return tuple(hf[f"{mixtral}.{n}.weight"] for n in ("w1", "w3", "w2"))
    raise KeyError(f"no weights for expert {expert} of layer {i}")


# ---- HF -> Megatron ----------------------------------------------------------------------------------
def layer_to_mcore(hf: Mapping[str, torch.Tensor], arch: ModelArch, i: int, shard: Shard,
                   wrong_qkv_interleave: bool = False) -> dict[str, torch.Tensor]:
    """One decoder layer's Megatron tensors for this shard, named relative to the layer."""
    tp, r = shard.tp_size, shard.tp_rank
    attn = f"{_hf_layer(i)}.self_attn"
    out = {
        "input_layernorm.weight": hf[f"{_hf_layer(i)}.input_layernorm.weight"],
        "pre_mlp_layernorm.weight": hf[f"{_hf_layer(i)}.post_attention_layernorm.weight"],
        "self_attention.linear_proj.weight": _part(hf[f"{attn}.o_proj.weight"], tp, r, dim=1),
    }
    qkv = fuse_qkv(*(hf[f"{attn}.{n}_proj.weight"] for n in "qkv"), arch, wrong_qkv_interleave)
    out["self_attention.linear_qkv.weight"] = _part(qkv, tp, r)
    if arch.qkv_bias:
        bias = fuse_qkv(*(hf[f"{attn}.{n}_proj.bias"] for n in "qkv"), arch, wrong_qkv_interleave)
        out["self_attention.linear_qkv.bias"] = _part(bias, tp, r)
    if arch.qk_norm:
        out["self_attention.q_layernorm.weight"] = hf[f"{attn}.q_norm.weight"]
        out["self_attention.k_layernorm.weight"] = hf[f"{attn}.k_norm.weight"]
    if arch.is_moe(i):
        out["mlp.router.weight"] = hf[_router_key(hf, i)]
        local = arch.num_experts // shard.ep_size
        for j in range(local):
            gate, up, down = hf_expert(hf, i, shard.ep_rank * local + j)
            prefix = f"mlp.experts.local_experts.{j}"
            out[f"{prefix}.linear_fc1.weight"] = _fc1(gate, up, shard.etp_size, shard.etp_rank)
            out[f"{prefix}.linear_fc2.weight"] = _part(down, shard.etp_size, shard.etp_rank, dim=1)
    else:
        mlp = f"{_hf_layer(i)}.mlp"
        out["mlp.linear_fc1.weight"] = _fc1(hf[f"{mlp}.gate_proj.weight"], hf[f"{mlp}.up_proj.weight"], tp, r)
        out["mlp.linear_fc2.weight"] = _part(hf[f"{mlp}.down_proj.weight"], tp, r, dim=1)
    return {name: t.contiguous() for name, t in out.items()}


def hf_to_mcore(hf: Mapping[str, torch.Tensor], arch: ModelArch, shard: Shard, layers: LayerMap,
                pre_process: bool, post_process: bool, wrong_qkv_interleave: bool = False) -> dict[str, torch.Tensor]:
    """Megatron parameter name -> tensor for one model chunk of one rank."""
    out: dict[str, torch.Tensor] = {}
    embed = hf["model.embed_tokens.weight"]
    if pre_process:
        out["embedding.word_embeddings.weight"] = _part(_pad_rows(embed, arch.padded_vocab_size),
                                                        shard.tp_size, shard.tp_rank)
    for local, global_index in layers.items():
        for name, tensor in layer_to_mcore(hf, arch, global_index, shard, wrong_qkv_interleave).items():
            out[f"decoder.layers.{local}.{name}"] = tensor
    if post_process:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        # tied weights need their own copy only on a last stage that does not hold the embedding
        if not arch.tied or not pre_process:
            head = embed if arch.tied else hf["lm_head.weight"]
            out["output_layer.weight"] = _part(_pad_rows(head, arch.padded_vocab_size), shard.tp_size,
                                               shard.tp_rank)
    return out


def local_name(name: str) -> str:
    """Inverse of `te_name` (other names unchanged): what a dist-ckpt stores under TE's fused names (Megatron's local
    spec maps its input norms onto them when it saves, so checkpoints of both specs agree)."""
    name = name.replace("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight")
    return name.replace("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight")


def te_name(name: str) -> str:
    """Local-spec name -> its Transformer Engine spec spelling: TE fuses the input norms into the next linear
    (not the pre-MLP norm of a MoE layer, which keeps its name: callers fall back when the TE name is absent)."""
    name = name.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight")
    return name.replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")


_SEQUENTIAL_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.(weight|bias)$")
_GROUPED_EXPERT = re.compile(r"mlp\.experts\.(linear_fc[12])\.(weight|bias)(\d+)$")


def grouped_expert_name(name: str) -> str:
    """SequentialMLP expert name -> its grouped-GEMM spelling: TEGroupedMLP holds one grouped linear per fc with
    local expert j's [out, in] matrix as `weight{j}` (megatron/core/transformer/moe/experts.py TEGroupedMLP,
    megatron/core/extensions/transformer_engine.py TEGroupedLinear; MindSpeed's stand-in registers the same
    names, mindspeed/te/pytorch/module/grouped_linear.py). Same shapes, so only the name changes."""
    return _SEQUENTIAL_EXPERT.sub(r"mlp.experts.\2.\3\1", name)


def sequential_expert_name(name: str) -> str:
    """Inverse of `grouped_expert_name` (other names unchanged)."""
    return _GROUPED_EXPERT.sub(r"mlp.experts.local_experts.\3.\1.\2", name)


# ---- Megatron -> HF ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class McorePiece:
    """One model chunk of one rank, as `hf_to_mcore` names it."""

    shard: Shard
    layers: LayerMap
    state: Mapping[str, torch.Tensor]


def _cat_ranks(parts: Mapping[int, torch.Tensor], dim: int = 0) -> torch.Tensor:
    missing = set(range(len(parts))) ^ set(parts)
    if missing:
        raise ValueError(f"shards missing for ranks {sorted(missing)}")
    return torch.cat([parts[r] for r in range(len(parts))], dim=dim)


def _any(parts: Mapping[int, torch.Tensor]) -> torch.Tensor:
    """A replicated tensor: every rank holds the same copy."""
    return next(iter(parts.values()))


def _unfc1(parts: Mapping[int, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    halves = [parts[r].chunk(2) for r in range(len(parts))]
    return torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])


def mcore_to_hf(pieces: Iterable[McorePiece], arch: ModelArch, expert_format: ExpertFormat = "per_expert",
                qk_swapped: bool = False) -> dict[str, torch.Tensor]:
    """Reassemble HF tensors from the Megatron pieces of every rank (any TP / PP / VPP / EP / ETP split).
    `qk_swapped`: the converter_qk_swap fault (split_qkv)."""
    dense: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
    experts: dict[tuple[int, int, str], dict[int, torch.Tensor]] = defaultdict(dict)
    for piece in pieces:
        for name, tensor in piece.state.items():
            name = sequential_expert_name(name)
            if name.startswith("decoder.layers."):
                local, rest = name[len("decoder.layers."):].split(".", 1)
                layer = piece.layers[int(local)]
                if rest.startswith("mlp.experts.local_experts."):
                    j, part = rest[len("mlp.experts.local_experts."):].split(".", 1)
                    expert = piece.shard.ep_rank * (arch.num_experts // piece.shard.ep_size) + int(j)
                    experts[(layer, expert, part)][piece.shard.etp_rank] = tensor
                    continue
                name = f"layer.{layer}.{rest}"
            dense[name][piece.shard.tp_rank] = tensor
    hf: dict[str, torch.Tensor] = {}
    vocab = arch.vocab_size
    hf["model.embed_tokens.weight"] = _cat_ranks(dense["embedding.word_embeddings.weight"])[:vocab]
    hf["model.norm.weight"] = _any(dense["decoder.final_layernorm.weight"])
    if not arch.tied:
        hf["lm_head.weight"] = _cat_ranks(dense["output_layer.weight"])[:vocab]
    for i in range(arch.num_layers):
        hf.update(_layer_to_hf(dense, experts, arch, i, expert_format, qk_swapped))
    return hf


def _layer_to_hf(dense: Mapping[str, dict[int, torch.Tensor]],
                 experts: Mapping[tuple[int, int, str], dict[int, torch.Tensor]], arch: ModelArch, i: int,
                 expert_format: ExpertFormat, qk_swapped: bool = False) -> dict[str, torch.Tensor]:
    src = f"layer.{i}"
    base, attn = _hf_layer(i), f"{_hf_layer(i)}.self_attn"
    out = {
        f"{base}.input_layernorm.weight": _any(dense[f"{src}.input_layernorm.weight"]),
        f"{base}.post_attention_layernorm.weight": _any(dense[f"{src}.pre_mlp_layernorm.weight"]),
        f"{attn}.o_proj.weight": _cat_ranks(dense[f"{src}.self_attention.linear_proj.weight"], dim=1),
    }
    q, k, v = split_qkv(_cat_ranks(dense[f"{src}.self_attention.linear_qkv.weight"]), arch, qk_swapped)
    out.update({f"{attn}.q_proj.weight": q, f"{attn}.k_proj.weight": k, f"{attn}.v_proj.weight": v})
    if arch.qkv_bias:
        q, k, v = split_qkv(_cat_ranks(dense[f"{src}.self_attention.linear_qkv.bias"]), arch, qk_swapped)
        out.update({f"{attn}.q_proj.bias": q, f"{attn}.k_proj.bias": k, f"{attn}.v_proj.bias": v})
    if arch.qk_norm:
        out[f"{attn}.q_norm.weight"] = _any(dense[f"{src}.self_attention.q_layernorm.weight"])
        out[f"{attn}.k_norm.weight"] = _any(dense[f"{src}.self_attention.k_layernorm.weight"])
    if not arch.is_moe(i):
        gate, up = _unfc1(dense[f"{src}.mlp.linear_fc1.weight"])
        out.update({f"{base}.mlp.gate_proj.weight": gate, f"{base}.mlp.up_proj.weight": up,
                    f"{base}.mlp.down_proj.weight": _cat_ranks(dense[f"{src}.mlp.linear_fc2.weight"], dim=1)})
        return out
    per_expert = []
    for e in range(arch.num_experts):
        gate, up = _unfc1(experts[(i, e, "linear_fc1.weight")])
        per_expert.append((gate, up, _cat_ranks(experts[(i, e, "linear_fc2.weight")], dim=1)))
    router = _any(dense[f"{src}.mlp.router.weight"])
    if expert_format == "fused":
        out[f"{base}.mlp.gate.weight"] = router
        out[f"{base}.mlp.experts.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u, _ in per_expert])
        out[f"{base}.mlp.experts.down_proj"] = torch.stack([d for _, _, d in per_expert])
    elif arch.model_type == "mixtral":
        out[f"{base}.block_sparse_moe.gate.weight"] = router
        for e, (gate, up, down) in enumerate(per_expert):
            names = dict(zip(("w1", "w3", "w2"), (gate, up, down), strict=True))
            out.update({f"{base}.block_sparse_moe.experts.{e}.{n}.weight": t for n, t in names.items()})
    else:
        out[f"{base}.mlp.gate.weight"] = router
        for e, (gate, up, down) in enumerate(per_expert):
            names = dict(zip(("gate_proj", "up_proj", "down_proj"), (gate, up, down), strict=True))
            out.update({f"{base}.mlp.experts.{e}.{n}.weight": t for n, t in names.items()})
    return out
