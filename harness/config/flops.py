"""Training FLOPs per token of a checkpoint, for MFU: PaLM's estimate (Chowdhery et al. 2022, appendix B),
6·N for the matmuls of forward + backward plus 12·L·H·T for attention scores, with N the parameters one token
passes through (embedding lookup excluded, MoE experts scaled by top-k / experts). Read from config.json and
the safetensors headers only, so no weights are loaded."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from parity.harness.contract.hf_config import expert_count


def _shapes(path: Path) -> dict[str, list[int]]:
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    return {name: meta["shape"] for name, meta in header.items() if name != "__metadata__"}


def active_params(checkpoint: Path) -> float:
    """Parameters one token's forward multiplies with."""
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    experts = expert_count(cfg)
    top_k = cfg.get("num_experts_per_tok") or 1
    shapes: dict[str, list[int]] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        shapes |= _shapes(file)
    untied = any(name.endswith("lm_head.weight") for name in shapes)
    total = 0.0
    for name, shape in shapes.items():
        if untied and name.endswith("embed_tokens.weight"):
            continue  # a lookup, not a matmul (a tied table is counted once, as the output layer)
        count = float(math.prod(shape))
        total += count * top_k / experts if experts and ".experts." in name else count
    return total


def train_flops_per_token(checkpoint: Path, seq_len: int) -> float:
    """FLOPs of one training step (forward + backward) per token; 0.0 when the checkpoint cannot be read."""
    try:
        cfg = json.loads((checkpoint / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        attention = 12.0 * int(cfg["num_hidden_layers"]) * int(cfg["hidden_size"]) * seq_len
        return 6.0 * active_params(checkpoint) + attention
    except (OSError, KeyError, ValueError, struct.error):
        return 0.0
