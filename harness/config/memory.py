"""Per-rank memory plan: a coarse estimate of what one rank of a scenario holds at its peak, from the model's
config alone (no torch, no weights), compared with the card's HBM (harness/config/devices.py).

The estimate is the largest rank's (the first or last pipeline stage, whichever holds more):

- parameters of the rank's share of the model, by layout: dense weights split over tp and pipeline stages,
  experts over ep * etp; FSDP-style engines shard everything over their fully-shard group;
- gradients and optimizer states (AdamW: two moments; an fp32 master copy for low-precision weights), the
  optimizer part divided over the data-parallel group when it is sharded (Megatron's distributed optimizer, FSDP);
- activations: the per-layer term of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", 34 * s * b * h bytes per layer at 16 bits, flash attention so no s^2 term) for the tokens
  a rank holds, divided by tp under sequence parallel, plus the fp32 logits of the vocabulary shard.

It is an order-of-magnitude check, not a profile: workspace, fragmentation, communication buffers and the
framework's own context (~1-3 GB per NPU) come on top, so a plan above FIT_FRACTION of HBM is flagged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.harness.config.devices import planning_model
from parity.harness.config.models import expand_model_path, is_tiny, tiny_config_dict
from parity.harness.contract.schema import Scenario

#: bytes per element of the weights a rank trains with
WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Megatron-LM reduces and accumulates bf16/fp16 gradients in fp32 (arguments.py forces
#: accumulate_allreduce_grads_in_fp32 for bf16); FSDP's reduce_dtype here is fp32 too
GRAD_BYTES = 4
#: AdamW exp_avg + exp_avg_sq in fp32
ADAM_BYTES = 8
#: fp32 master weights kept by the optimizer when the model weights are 16-bit
MASTER_BYTES = 4
#: activation bytes per token per hidden unit per layer at 16 bits (Korthikanti et al. 2022, flash attention)
ACTIVATION_FACTOR = 34
#: a plan above this share of HBM is flagged (the estimate leaves out workspace and runtime context)
FIT_FRACTION = 0.9
#: static states alone (weights + grads + optimizer) above this multiple of HBM cannot run at all: a layout error
IMPOSSIBLE_MULTIPLE = 2.0

#: strategies whose parameters, gradients and optimizer states are fully sharded over the data-parallel ranks
FULLY_SHARDED = ("fsdp2", "mindspeed_fsdp")
#: strategies with Megatron's layout semantics (tp / pp / ep shard the weights; dp only the optimizer, if at all)
MEGATRON_LIKE = ("megatron", "mindspeed_megatron")


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameter counts of a decoder-only transformer, from its HF config."""

    embedding: int
    head: int
    """0 when tied to the embedding."""
    dense_per_layer: int
    """Attention, norms, dense MLP (if any), router and shared experts of one average layer."""
    experts_per_layer: int
    """Routed-expert weights of one average layer (all experts)."""
    layers: int
    hidden: int
    vocab: int

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.layers * (self.dense_per_layer + self.experts_per_layer)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Bytes one rank holds at its peak, by kind, and the card it is compared with."""

    params: int
    """Parameters on the rank (elements)."""
    weights: int
    grads: int
    optimizer: int
    activations: int
    hbm_bytes: int | None
    card: str | None

    @property
    def states(self) -> int:
        return self.weights + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.states + self.activations

    @property
    def fraction(self) -> float | None:
        return self.total / self.hbm_bytes if self.hbm_bytes else None

    @property
    def level(self) -> str:
        """'fits', 'over' (above FIT_FRACTION of HBM: likely OOM), 'impossible' (states alone far above HBM) or
        'unknown' (no HBM figure for this device)."""
        if not self.hbm_bytes:
            return "unknown"
        if self.states > IMPOSSIBLE_MULTIPLE * self.hbm_bytes:
            return "impossible"
        return "over" if self.total > FIT_FRACTION * self.hbm_bytes else "fits"

    def render(self) -> str:
        parts = (f"weights {_gb(self.weights)} + grads {_gb(self.grads)} + optimizer {_gb(self.optimizer)} + "
                 f"activations {_gb(self.activations)} = {_gb(self.total)} per rank ({self.params / 1e9:.2f} B "
                 "params)")
        if not self.hbm_bytes:
            return f"{parts}; HBM unknown for this device"
        verdict = {"fits": "fits", "over": "OVER: likely OOM", "impossible": "IMPOSSIBLE"}[self.level]
        return f"{parts}; {self.fraction:.0%} of {_gb(self.hbm_bytes)} HBM ({self.card}): {verdict}"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def model_config(model: str) -> dict[str, Any] | None:
    """The HF config dict of a tiny model or of `<path>/config.json`; None when there is none to read."""
    if is_tiny(model):
        return tiny_config_dict(model)
    config_file = Path(expand_model_path(model)) / "config.json"
    if not config_file.is_file():
        return None
    return json.loads(config_file.read_text())


def param_counts(config: dict[str, Any]) -> ParamCounts:
    """Parameter counts for Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral-style configs (the text_config of
    multimodal ones)."""
    cfg = config.get("text_config", config)
    family = str(cfg.get("model_type") or cfg.get("config_class", "")).lower().removesuffix("config")
    hidden, vocab, layers = int(cfg["hidden_size"]), int(cfg["vocab_size"]), int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads) + 2 * hidden  # q, k, v, o + two layer norms
    if cfg.get("attention_bias") or family == "qwen2":  # q/k/v biases
        attention += head_dim * (heads + 2 * kv_heads)
    if family.startswith("qwen3"):  # per-head q_norm / k_norm
        attention += 2 * head_dim
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    dense_mlp = 3 * hidden * int(cfg["intermediate_size"])
    dense, routed = attention + dense_mlp, 0
    if experts:
        expert_size = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
        moe = _moe_layers(cfg, layers)
        shared = 3 * hidden * int(cfg.get("shared_expert_intermediate_size") or 0)
        dense = attention + ((layers - moe) * dense_mlp + moe * (hidden * experts + shared)) // layers
        routed = moe * experts * 3 * hidden * expert_size // layers
    tied = bool(cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    return ParamCounts(embedding=vocab * hidden, head=0 if tied else vocab * hidden,
                       dense_per_layer=dense + hidden // layers, experts_per_layer=routed, layers=layers,
                       hidden=hidden, vocab=vocab)


def _moe_layers(cfg: dict[str, Any], layers: int) -> int:
    """Layers with routed experts: Qwen-MoE's decoder_sparse_step and mlp_only_layers; every layer otherwise."""
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense_only = set(cfg.get("mlp_only_layers") or [])
    return sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)


@dataclass(frozen=True, slots=True)
class _Share:
    params: int
    """Parameters the rank owns (its shard)."""
    optimizer_params: int
    """Parameters whose optimizer states the rank holds (fewer than params under a sharded optimizer)."""
    gathered: int
    """Parameters all-gathered transiently (FSDP: the largest unsharded layer)."""
    master_weights: bool
    """16-bit weights with fp32 masters in the optimizer (Megatron's recipe); FSDP keeps fp32 shards instead."""


def _rank_share(scenario: Scenario, counts: ParamCounts) -> _Share:
    """What the largest rank (a pipeline end stage) holds under the scenario's strategy and layout."""
    lay = scenario.layout
    layers_here = -(-counts.layers // lay.pp)
    ends = counts.embedding + counts.head if lay.pp == 1 else max(counts.embedding, counts.head)
    if scenario.strategy in MEGATRON_LIKE:
        dense = (layers_here * counts.dense_per_layer + ends) // lay.tp
        experts = layers_here * counts.experts_per_layer // (lay.ep * lay.etp)
        sharded = bool(scenario.mcore_kwargs.get("use_distributed_optimizer", False))
        dense_dp = lay.dp * lay.cp if sharded else 1  # Megatron's optimizer shards over the dp x cp group
        expert_dp = max(1, lay.dp * lay.cp * lay.tp // (lay.ep * lay.etp)) if sharded else 1
        return _Share(dense + experts, dense // dense_dp + experts // expert_dp, 0, scenario.dtype != "fp32")
    if scenario.strategy in FULLY_SHARDED:  # every parameter sharded over the world (TP x fully_shard)
        shard = counts.total // lay.world_size
        layer = (counts.dense_per_layer + counts.experts_per_layer // lay.ep) // lay.tp
        return _Share(shard, shard, layer, False)
    return _Share(counts.total, counts.total, 0, False)  # hf and third-party engines: a full copy per rank


def estimate(scenario: Scenario, config: dict[str, Any]) -> MemoryPlan:
    """The per-rank memory plan of `scenario` for a model with this HF config."""
    counts = param_counts(config)
    share = _rank_share(scenario, counts)
    weight_bytes = WEIGHT_BYTES[scenario.dtype] if share.master_weights or scenario.dtype == "fp32" else 4
    optimizer_bytes = ADAM_BYTES + (MASTER_BYTES if share.master_weights else 0)
    model = planning_model(scenario.device) if scenario.device != "cpu" else None
    return MemoryPlan(params=share.params,
                      weights=weight_bytes * share.params + WEIGHT_BYTES[scenario.dtype] * share.gathered,
                      grads=GRAD_BYTES * share.params, optimizer=optimizer_bytes * share.optimizer_params,
                      activations=_activations(scenario, counts), hbm_bytes=model.hbm_bytes if model else None,
                      card=model.match if model else None)


def _activations(scenario: Scenario, counts: ParamCounts) -> int:
    """Activations of the rank's share of the global batch through its layers, plus its fp32 logits."""
    lay, wl = scenario.layout, scenario.workload
    tokens = wl.batch_size // lay.dp * wl.seq_len // (lay.cp * lay.ulysses)
    per_token_layer = ACTIVATION_FACTOR * counts.hidden * WEIGHT_BYTES[scenario.dtype] // 2
    if lay.sequence_parallel:
        per_token_layer //= lay.tp
    layers_here = -(-counts.layers // lay.pp)
    logits = tokens * (counts.vocab // lay.tp) * 4 * 2  # fp32 logits and their log-softmax
    return tokens * per_token_layer * layers_here + logits


def plan_for(scenario: Scenario) -> MemoryPlan | None:
    """The plan, or None when the model's config cannot be read here (an unset $PATH variable)."""
    config = model_config(scenario.model)
    return estimate(scenario, config) if config is not None else None
