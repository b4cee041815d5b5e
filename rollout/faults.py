"""Planted defects of the weight sync, each applied to the tensors the trainer exported before vLLM loads them:
what an exporter or a sync with that bug would hand over. (The sixth fault, the rollout's temperature not applied
to its returned log-probs, is planted in the rollout engine: rollout/lane.py.)"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from parity.rollout.schema import SyncFault

EMBEDDING_NAMES = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True, slots=True)
class Attention:
    """What the q/k plant needs of the model: heads, KV heads, head_dim (from its config.json)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int


def _layer(name: str) -> int | None:
    match = re.search(r"\.layers\.(\d+)\.", name)
    return int(match.group(1)) if match else None


def qk_swapped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attention: Attention) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as an exporter reads them when it splits a fused [q; k; v]-per-KV-group block (Megatron's
    linear_qkv, mbridge's split) in the order [k; q; v]: the shapes still fit, so no loader refuses it."""
    groups, d = attention.num_kv_heads, attention.head_dim
    q_rows = attention.num_heads // groups * d
    rest = q.shape[1:]
    fused = torch.cat([q.reshape(groups, q_rows, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)],
                      dim=1)
    k2, q2, _ = fused.split([d, q_rows, d], dim=1)
    return q2.reshape(q.shape), k2.reshape(k.shape)


def plant(weights: Mapping[str, torch.Tensor], faults: tuple[SyncFault, ...],
          attention: Attention) -> dict[str, torch.Tensor]:
    """The tensors a sync with these faults would deliver."""
    out = dict(weights)
    for fault in faults:
        if fault.kind == "sync_layer_skipped":
            out = {n: t for n, t in out.items() if _layer(n) != fault.layer}
        elif fault.kind == "sync_tied_embedding_skipped":
            out = {n: t for n, t in out.items() if n not in EMBEDDING_NAMES}
        elif fault.kind == "sync_bf16":
            out = {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in out.items()}
        elif fault.kind == "sync_qk_swapped":
            for name in [n for n in out if n.endswith("self_attn.q_proj.weight")]:
                stem = name.removesuffix("q_proj.weight")
                out[name], out[stem + "k_proj.weight"] = qk_swapped(
                    out[name], out[stem + "k_proj.weight"], out[stem + "v_proj.weight"], attention)
        elif fault.kind == "sync_tp_shard_duplicated":
            # a column-parallel weight (rows split over TP) gathered with shard 0 in shard 1's place
            name = f"model.layers.{fault.layer}.mlp.gate_proj.weight"
            if name not in out:
                raise KeyError(f"sync_tp_shard_duplicated: the export has no {name}")
            shards = list(out[name].chunk(fault.shards, dim=0))
            shards[1] = shards[0]
            out[name] = torch.cat(shards)
    return out
