"""Pieces the transformers-based engines share: loading, precision, the model's inputs, router loads, the hf
engine's checkpoint files. No loss, optimizer or schedule: the reference (the hf engine) has its own in
parity.reference, the candidates theirs in engines/training.py and harness/contract/losses.py."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import torch

from parity.harness.contract.engine import EngineContext
from parity.harness.contract.hf_config import expert_count
from parity.harness.contract.workload import Batch


def load_hf_model(ctx: EngineContext, attn_implementation: str = "sdpa",
                  device: torch.device | None = None) -> torch.nn.Module:
    """fp32 master weights on `device` (default ctx.device); low precision comes from autocast / mixed-precision
    policies."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(ctx.checkpoint)
    ctx.faults.patch_hf_config(config)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        ctx.checkpoint, config=config, dtype=torch.float32, attn_implementation=attn_implementation)
    model.config.use_cache = False
    return model.to(device or ctx.device)


def load_on_rank0(ctx: EngineContext, attn_implementation: str = "sdpa") -> tuple[torch.nn.Module, dict | None]:
    """The model as verl's FSDP engine loads it (verl/workers/engine/fsdp/transformer_impl.py _build_module): rank 0
    reads the checkpoint in fp32 on the host, every other rank builds the model from its config on the meta device.
    Returns the model and rank 0's full state dict (None elsewhere), for `broadcast_into_shards` once the model is
    sharded: no rank ever holds the whole model on its device."""
    import transformers

    if ctx.rank == 0:
        model = load_hf_model(ctx, attn_implementation, device=torch.device("cpu"))
        return model, model.state_dict()
    config = transformers.AutoConfig.from_pretrained(ctx.checkpoint)
    ctx.faults.patch_hf_config(config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                              attn_implementation=attn_implementation)
    model.config.use_cache = False
    return model, None


def broadcast_into_shards(model: torch.nn.Module, full_state: dict | None, device: torch.device) -> None:
    """After sharding (fully_shard / TP), fill every rank's shards from rank 0's state dict, tensor by tensor
    (torch's set_model_state_dict with broadcast_from_rank0, as verl's fsdp2_load_full_state_dict), and the buffers
    a state dict leaves out (RoPE's inv_freq) from rank 0's, by name."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if full_state is None:
        model.to_empty(device=device)
    else:
        model.to(device)
    set_model_state_dict(model, full_state or {}, options=StateDictOptions(full_state_dict=True,
                                                                          broadcast_from_rank0=True))
    persistent = set(model.state_dict())
    for name, buffer in sorted(model.named_buffers()):
        if name not in persistent:
            dist.broadcast(buffer.data, src=0)


def autocast(ctx: EngineContext) -> contextlib.AbstractContextManager[Any]:
    """bf16/fp16 compute over fp32 master weights (the usual mixed-precision recipe)."""
    if ctx.scenario.dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=ctx.device.type, dtype=ctx.dtype)


def model_inputs(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    return {"input_ids": batch.input_ids.to(device), "attention_mask": batch.attention_mask.to(device),
            "position_ids": batch.position_ids.to(device)}


_ROUTER = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:mlp|block_sparse_moe)\.gate$")


class RouterLoads:
    """Tokens per expert per MoE layer of a transformers model, counted at its routers (`layers.i.mlp.gate`,
    which return (logits, weights, selected experts) in transformers 5) over the tokens marked real: the load an
    aux loss balances (transformers' own `load_balancing_loss_func` takes the attention mask for the same
    reason). Counting is on inside `counting(real)` only."""

    def __init__(self, model: torch.nn.Module) -> None:
        config = getattr(model.config, "text_config", None) or model.config
        self.experts = expert_count(config)
        self.top_k = int(getattr(config, "num_experts_per_tok", 0) or 0)
        self.counts: dict[str, torch.Tensor] = {}
        self._real: torch.Tensor | None = None
        for name, module in model.named_modules():
            if match := _ROUTER.search(name):
                module.register_forward_hook(self._hook(f"layers.{match.group(1)}.mlp"))

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def _hook(self, layer: str) -> Any:
        def count(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self._real is None:
                return
            if isinstance(output, tuple):
                selected = output[-1]
            else:  # a router that returns logits only: the model's softmax top-k
                selected = torch.topk(torch.softmax(output.float(), dim=-1), self.top_k, dim=-1).indices
            chosen = selected[self._real.to(selected.device)]
            counts = torch.bincount(chosen.reshape(-1), minlength=self.experts).double().cpu()
            self.counts[layer] = self.counts.get(layer, torch.zeros(self.experts, dtype=torch.float64)) + counts

        return count

    @contextlib.contextmanager
    def counting(self, real: torch.Tensor) -> Any:
        """Count the routers' choices for the tokens where `real` (flattened in the model's token order) holds."""
        self._real = real.reshape(-1).bool()
        try:
            yield
        finally:
            self._real = None

    def take(self) -> dict[str, list[float]] | None:
        """The counts so far, reset; None for a dense model."""
        if not self.moe:
            return None
        loads = {layer: counts.tolist() for layer, counts in sorted(self.counts.items())}
        self.counts = {}
        return loads


def save_hf_state(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  scheduler: torch.optim.lr_scheduler.LRScheduler, masters: list[torch.Tensor] | None = None) -> None:
    """One process's whole training state in torch's own formats (the `hf` engine's checkpoint)."""
    torch.save({"model": model.state_dict(), "masters": masters, "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict()}, directory / HF_STATE)


HF_STATE = "hf_engine_state.pt"


def hf_state_to_checkpoint(state_dict: dict[str, torch.Tensor], config: Any, hf_dir: Path) -> None:
    """Write a model state dict in HF names as an HF checkpoint: `config` (a transformers config) and one
    model.safetensors. A tied model's lm_head is the embedding: left out, as save_pretrained leaves it out."""
    from safetensors.torch import save_file

    hf_dir.mkdir(parents=True, exist_ok=True)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    tensors = {name: tensor.detach().float().contiguous().clone() for name, tensor in state_dict.items()
               if not (tied and name == "lm_head.weight")}
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(hf_dir)
