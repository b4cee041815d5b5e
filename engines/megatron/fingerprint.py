"""Megatron-Core's modules under the harness's canonical fingerprint names (parity.harness.contract.fingerprint):
GPTModel.embedding, each TransformerLayer's self_attention / mlp (MoELayer.router: its probabilities, output 0) /
the layer (numbered by its global `layer_number`, so pipeline stages name their own), decoder.final_layernorm and
output_layer (megatron/core/models/gpt/gpt_model.py GPTModel.__init__, transformer/transformer_layer.py)."""

from __future__ import annotations

from typing import Any

import torch

from parity.harness.contract.fingerprint import Points


def _gpt_model(chunk: torch.nn.Module) -> torch.nn.Module | None:
    return next((m for m in chunk.modules() if hasattr(m, "decoder") and hasattr(m, "pre_process")), None)


def megatron_points(chunks: list[torch.nn.Module], tp: int, tp_rank: int, sequence_parallel: bool) -> Points:
    """Points of this rank's model chunks. Without sequence parallel every tensor-parallel rank holds the whole
    residual stream (replicated), and the logits are split over the vocabulary; with it, the stream is split
    over the sequence (`seq_shard`)."""
    modules: dict[str, tuple[torch.nn.Module, int]] = {}
    for chunk in chunks:
        gpt = _gpt_model(chunk)
        if gpt is None:
            continue
        if gpt.pre_process:
            modules["embedding"] = (gpt.embedding, 0)
        for layer in gpt.decoder.layers:
            i = int(layer.layer_number) - 1
            modules[f"layer{i}.attention"] = (layer.self_attention, 0)
            router: Any = getattr(layer.mlp, "router", None)
            if isinstance(router, torch.nn.Module):
                modules[f"layer{i}.router"] = (router, 0)
            modules[f"layer{i}.mlp"] = (layer.mlp, 0)
            modules[f"layer{i}.output"] = (layer, 0)
        if gpt.post_process:
            if getattr(gpt.decoder, "final_layernorm", None) is not None:
                modules["final_norm"] = (gpt.decoder.final_layernorm, 0)
            modules["lm_head"] = (gpt.output_layer, 0)
    return Points(modules, roots=list(chunks), seq_first=True, replicas=tp,
                  whole_replicated=frozenset(name for name in modules if name != "lm_head"),
                  seq_shard=(tp_rank, tp) if sequence_parallel and tp > 1 else None)
