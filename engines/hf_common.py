"""Pieces the transformers-based engines share: loading, precision, optimizer, response scoring."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

from parity.harness.contract.engine import EngineContext
from parity.harness.contract.schema import Workload
from parity.harness.contract.workload import Batch


def load_hf_model(ctx: EngineContext, attn_implementation: str = "sdpa") -> torch.nn.Module:
    """fp32 master weights on ctx.device; low precision comes from autocast / mixed-precision policies."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(ctx.checkpoint)
    ctx.faults.patch_hf_config(config)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        ctx.checkpoint, config=config, dtype=torch.float32, attn_implementation=attn_implementation)
    model.config.use_cache = False
    return model.to(ctx.device)


def make_optimizer(params: Iterable[torch.nn.Parameter], workload: Workload) -> torch.optim.Optimizer:
    params = list(params)
    if workload.optimizer == "sgd":
        return torch.optim.SGD(params, lr=workload.lr, weight_decay=workload.weight_decay)
    # foreach=False: the same per-parameter kernels for plain tensors and FSDP2 DTensor shards
    return torch.optim.AdamW(params, lr=workload.lr, weight_decay=workload.weight_decay, foreach=False)


def autocast(ctx: EngineContext) -> contextlib.AbstractContextManager[Any]:
    """bf16/fp16 compute over fp32 master weights (the usual mixed-precision recipe)."""
    if ctx.scenario.dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=ctx.device.type, dtype=ctx.dtype)


def response_logits(logits: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Logits that score the response tokens: positions P-1 .. S-2."""
    return logits[:, prompt_len - 1:-1]


def model_inputs(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    return {"input_ids": batch.input_ids.to(device), "attention_mask": batch.attention_mask.to(device),
            "position_ids": batch.position_ids.to(device)}
