"""Per-rank memory plan: what one rank of a scenario holds at its peak, from the model's config alone (no torch,
no weights), compared with the card's HBM (harness/config/devices.py). The engine's part is its spec's
MemoryTraits (how it shards, loads and micro-batches).

Two peaks, the larger counts:

- training: the rank's states (weights, fp32 gradients, AdamW moments and fp32 masters, each divided as the layout
  and engine shard them; host-offloaded optimizer states left out) + the largest of three phases: the start of
  backward (the gradient buffer where the engine keeps one, the activations it saved — micro-batches in flight x
  the tokens of one micro-batch x what each layer saves, divided by tp under sequence parallel and by cp /
  ulysses; recompute keeps only layer inputs — the loss's vocabulary-wide tensors on the last stage, MoE dispatch
  buffers, FSDP's gathered layer), a recomputed group during backward, and the optimizer step (every gradient,
  one layer's unsharded, the step's temporaries);
- loading: per MemoryTraits.load, the whole model on every rank (replicated), the rank's shard plus one tensor
  being broadcast (rank0_broadcast, verl's way), or the rank's shard plus one tensor being read (sharded_read).

What a layer saves is counted per tensor for a decoder layer with GQA, RMSNorm and a SwiGLU (or top-k routed
SwiGLU experts) MLP, flash attention on an accelerator (no s x s term) and, on CPU, the engine's own path
(MemoryTraits.cpu_layer_factor, and cpu_attention_matrix for one that materialises the attention matrix: Megatron's
local attention); Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models") give
the SP / TP / pipeline rules.
Workspace, fragmentation, communication buffers and the framework's own context (~1-3 GB per NPU) come on top, so
a plan above FIT_FRACTION of HBM is flagged. docs/ascend.md has the CPU measurements it was checked against
(benchmarks/memory_plan.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from parity.harness.config.devices import planning_model
from parity.harness.config.models import model_config
from parity.harness.config.registry import import_path, spec_for
from parity.harness.contract.hf_config import expert_count
from parity.harness.contract.schema import Scenario
from parity.harness.contract.spec import MemoryTraits

#: bytes per element of the weights a rank trains with
WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Megatron-LM reduces and accumulates bf16/fp16 gradients in fp32 (arguments.py forces
#: accumulate_allreduce_grads_in_fp32 for bf16); FSDP's reduce_dtype here is fp32 too
GRAD_BYTES = 4
#: AdamW exp_avg + exp_avg_sq in fp32
ADAM_BYTES = 8
#: fp32 master weights kept by the optimizer when the model weights are 16-bit
MASTER_BYTES = 4
FP32 = 4
#: fp32 tensors of the vocabulary's width per scored token at the backward peak of the shared loss
#: (harness/contract/losses.py logprobs_and_entropy: log-softmax and its exp kept for backward, and at the exp's
#: backward the two gradients of their product and the exp's own), as torch's profiler attributes the live
#: tensors at the peak (benchmarks/memory_plan.py)
LOSS_VOCAB_COPIES = 5
#: SwiGLU tensors of the MLP's intermediate width saved per token: gate, up, act(gate) and their product
#: (transformers' Qwen3MLP, Megatron's unfused glu on CPU; a fused SwiGLU kernel saves one fewer)
MLP_SAVED = 4
#: a plan above this share of HBM is flagged (the estimate leaves out workspace and runtime context)
FIT_FRACTION = 0.9
#: static states alone (weights + grads + optimizer) above this multiple of HBM cannot run at all: a layout error
IMPOSSIBLE_MULTIPLE = 2.0


@dataclass(frozen=True, slots=True)
class ModelDims:
    """Parameter counts and the widths activations depend on, for Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral."""

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
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    """Dense MLP intermediate width."""
    experts: int = 0
    topk: int = 0
    expert_ffn: int = 0
    moe_layers: int = 0
    qk_norm: bool = False

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.layers * (self.dense_per_layer + self.experts_per_layer)

    @property
    def largest_tensor(self) -> int:
        """Elements of the largest single weight: the embedding or head, a dense MLP projection, or transformers'
        fused expert gate_up tensor [experts, 2 x expert_ffn, hidden]."""
        return max(self.vocab * self.hidden, self.ffn * self.hidden, self.experts * 2 * self.expert_ffn * self.hidden)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Bytes one rank holds at its peak, by kind, and the card it is compared with."""

    params: int
    """Parameters on the rank (elements)."""
    weights: int
    grads: int
    optimizer: int
    activations: int
    """Saved for backward at the start of backward (every micro-batch in flight)."""
    hbm_bytes: int | None
    card: str | None
    loss: int = 0
    """The vocabulary-wide fp32 tensors of the loss's backward (last pipeline stage)."""
    train: int = 0
    """The training peak: weights + optimizer + the largest phase (start of backward with the gradient buffer,
    activations, loss tensors and gathered parameters; a recomputed group; the optimizer step with every gradient
    and its temporaries)."""
    load: int = 0
    """Device bytes at the load-time peak."""
    load_how: str = ""
    host_load: int = 0
    """Host bytes the node holds while loading (rank 0's whole model, or every rank's)."""
    in_flight: str = ""
    """How the activations were counted (micro-batches in flight, recompute)."""
    verl_load: int | None = None
    """The load peak the way verl's FSDP engine loads (rank 0 reads, broadcasts), for an engine that loads
    otherwise."""

    @property
    def states(self) -> int:
        return self.weights + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return max(self.train, self.load)

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
        parts = (f"weights {_gb(self.weights)}, grads {_gb(self.grads)}, optimizer {_gb(self.optimizer)}, "
                 f"activations {_gb(self.activations)} ({self.in_flight}), loss {_gb(self.loss)}: training peak "
                 f"{_gb(self.train)}; load {_gb(self.load)} ({self.load_how}; host {_gb(self.host_load)})")
        if self.verl_load is not None:
            parts += f", {_gb(self.verl_load)} if it loaded the way verl does (rank 0 reads, broadcasts)"
        parts += f"; peak {_gb(self.total)} per rank ({self.params / 1e9:.2f} B params)"
        if not self.hbm_bytes:
            return f"{parts}; HBM unknown for this device"
        verdict = {"fits": "fits", "over": "OVER: likely OOM", "impossible": "IMPOSSIBLE"}[self.level]
        at = " at load" if self.level == "over" and self.load > self.train else ""
        return f"{parts}; {self.fraction:.0%} of {_gb(self.hbm_bytes)} HBM ({self.card}): {verdict}{at}"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def param_counts(config: dict[str, Any]) -> ModelDims:
    """Parameter counts and widths from an HF config (the text_config of multimodal ones)."""
    cfg = config.get("text_config", config)
    family = str(cfg.get("model_type") or cfg.get("config_class", "")).lower().removesuffix("config")
    hidden, vocab, layers = int(cfg["hidden_size"]), int(cfg["vocab_size"]), int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads) + 2 * hidden  # q, k, v, o + two layer norms
    if cfg.get("attention_bias") or family == "qwen2":  # q/k/v biases
        attention += head_dim * (heads + 2 * kv_heads)
    qk_norm = family.startswith("qwen3")
    if qk_norm:  # per-head q_norm / k_norm
        attention += 2 * head_dim
    experts = expert_count(cfg)
    ffn = int(cfg["intermediate_size"])
    dense_mlp = 3 * hidden * ffn
    dense, routed, moe, expert_ffn = attention + dense_mlp, 0, 0, 0
    if experts:
        expert_ffn = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
        moe = _moe_layers(cfg, layers)
        shared = 3 * hidden * int(cfg.get("shared_expert_intermediate_size") or 0)
        dense = attention + ((layers - moe) * dense_mlp + moe * (hidden * experts + shared)) // layers
        routed = moe * experts * 3 * hidden * expert_ffn // layers
    tied = bool(cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    return ModelDims(embedding=vocab * hidden, head=0 if tied else vocab * hidden,
                     dense_per_layer=dense + hidden // layers, experts_per_layer=routed, layers=layers,
                     hidden=hidden, vocab=vocab, heads=heads, kv_heads=kv_heads, head_dim=head_dim, ffn=ffn,
                     experts=experts, topk=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
                     expert_ffn=expert_ffn, moe_layers=moe, qk_norm=qk_norm)


def _moe_layers(cfg: dict[str, Any], layers: int) -> int:
    """Layers with routed experts: Qwen-MoE's decoder_sparse_step and mlp_only_layers; every layer otherwise."""
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense_only = set(cfg.get("mlp_only_layers") or [])
    return sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)


# ---- states ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Share:
    params: int
    """Parameters the rank owns (its shard)."""
    optimizer_params: int
    """Parameters whose optimizer states the rank holds on the device."""
    layer: int
    """Parameters of the largest layer as the rank computes it (FSDP: all-gathered)."""
    layers: int
    """Decoder layers on the rank's pipeline stage."""
    ends: int
    """Embedding / head parameters on the stage, as sharded."""
    master_weights: bool
    """16-bit weights with fp32 masters in the optimizer (Megatron's recipe); FSDP keeps fp32 shards instead."""


def _rank_share(scenario: Scenario, dims: ModelDims, traits: MemoryTraits, first_stage: bool) -> _Share:
    """What one pipeline end stage holds under the engine's sharding and the layout."""
    lay = scenario.layout
    layers_here = -(-dims.layers // lay.pp)
    ends = dims.embedding + dims.head if lay.pp == 1 else dims.embedding if first_stage else dims.head
    if traits.sharding == "model_parallel":
        etp = lay.etp if lay.ep > 1 else lay.tp
        dense = (layers_here * dims.dense_per_layer + ends) // lay.tp
        experts = layers_here * dims.experts_per_layer // (lay.ep * etp)
        sharded = bool(scenario.mcore_kwargs.get("use_distributed_optimizer", False))
        dense_dp = lay.dp * lay.cp if sharded else 1  # Megatron's optimizer shards over the dp x cp group
        expert_dp = max(1, lay.dp * lay.cp * lay.tp // (lay.ep * etp)) if sharded else 1
        on_device = dense // dense_dp + experts // expert_dp
        offloaded = float(scenario.mcore_kwargs.get("optimizer_offload_fraction", 1.0)) \
            if scenario.mcore_kwargs.get("optimizer_cpu_offload") else 0.0
        return _Share(dense + experts, int(on_device * (1 - offloaded)), 0, layers_here, ends // lay.tp,
                      scenario.dtype != "fp32")
    if traits.sharding == "fully_sharded":  # every parameter sharded over the world (TP x fully_shard)
        shard = dims.total // lay.world_size
        layer = (dims.dense_per_layer + dims.experts_per_layer // lay.ep) // lay.tp
        if not scenario.fsdp_kwargs.get("reshard_after_forward", True):
            layer = (dims.layers * (dims.dense_per_layer + dims.experts_per_layer // lay.ep)) // lay.tp
        optimizer = 0 if _fsdp_offload(scenario) else shard
        return _Share(shard, optimizer, layer, dims.layers, dims.embedding + dims.head, False)
    return _Share(dims.total, dims.total, 0, dims.layers, dims.embedding + dims.head, False)


def _fsdp_offload(scenario: Scenario) -> bool:
    """FSDP2's CPUOffloadPolicy keeps the sharded parameters, gradients and optimizer step on the host (verl's
    fsdp_config.offload_policy)."""
    tree = scenario.actor_rollout_ref
    config = (tree.get("actor") or {}).get("fsdp_config") or {} if isinstance(tree, dict) else {}
    return bool(config.get("offload_policy") or tree.get("actor.fsdp_config.offload_policy"))


# ---- activations -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Recompute:
    full_groups: int | None
    """Layers per recomputed group (full recompute: each group keeps only its input); None: no full recompute."""
    block: int | None
    """Megatron's 'block' method: the first N layers of a chunk recomputed, the others store everything."""
    drops_attention_matrix: bool
    what: str


def _recompute(scenario: Scenario, traits: MemoryTraits) -> _Recompute:
    if traits.sharding == "model_parallel":
        kw = scenario.mcore_kwargs
        granularity, method = kw.get("recompute_granularity"), kw.get("recompute_method")
        layers = int(kw.get("recompute_num_layers") or 1)
        if granularity == "full":
            if method == "block":
                return _Recompute(None, layers, True, f"full recompute of the first {layers} layers per chunk")
            return _Recompute(layers, None, True, f"full recompute, groups of {layers} layers")
        if granularity == "selective":
            return _Recompute(None, None, True, "selective recompute")
        return _Recompute(None, None, False, "")
    model = (scenario.actor_rollout_ref.get("model") or {}) if isinstance(scenario.actor_rollout_ref, dict) else {}
    if scenario.fsdp_kwargs.get("recompute") or model.get("enable_gradient_checkpointing") \
            or scenario.actor_rollout_ref.get("model.enable_gradient_checkpointing"):
        return _Recompute(1, None, True, "per-layer gradient checkpointing")
    return _Recompute(None, None, False, "")


def _layer_elements(dims: ModelDims, scenario: Scenario, seq_kv: int, materialised: bool) -> tuple[float, float]:
    """(elements saved per token in one decoder layer, of which the replicated layer input) for one rank."""
    lay = scenario.layout
    tp = lay.tp
    hidden = 4 * dims.hidden  # the two norms' inputs and the normed inputs of attention and MLP
    if lay.sequence_parallel:
        hidden /= tp
    attention = 2 * dims.heads * dims.head_dim + 2 * dims.kv_heads * dims.head_dim  # q, k, v, attention output
    if dims.qk_norm:
        attention += (dims.heads + dims.kv_heads) * dims.head_dim
    if materialised:  # the attention probabilities (CPU: no fused attention kernel)
        attention += dims.heads * seq_kv
    attention /= tp
    dense_mlp = MLP_SAVED * dims.ffn / tp
    mlp = dense_mlp
    if dims.experts:
        # each token's top-k copies go through an expert: its (permuted) input and the MLP's saved tensors,
        # balanced over the ranks; the router's logits and probabilities in fp32
        expert = dims.topk * (dims.hidden + MLP_SAVED * dims.expert_ffn) / tp + 2 * dims.experts
        moe_share = dims.moe_layers / dims.layers
        mlp = moe_share * expert + (1 - moe_share) * dense_mlp
    layer_input = dims.hidden / (tp if lay.sequence_parallel else 1)
    return hidden + attention + mlp, layer_input


def _in_flight(scenario: Scenario, traits: MemoryTraits, rows: int, first_stage: bool) -> tuple[int, float]:
    """(rows per micro-batch, micro-batches of the stage's layers in flight at the peak)."""
    lay = scenario.layout
    if traits.micro_batch_rows is None:
        return rows, 1.0
    per_micro = max(1, min(rows, int(import_path(traits.micro_batch_rows)(scenario))))
    micro_batches = max(1, rows // per_micro)
    if lay.pp == 1 or not first_stage:
        return per_micro, 1.0  # no pipelining, or the last stage (1F1B: forward then backward at once)
    if lay.vpp == 1:
        return per_micro, float(min(lay.pp, micro_batches))
    # Megatron's interleaved schedule: rank 0 runs (pp - 1) * 2 + (vpp - 1) * pp warm-up chunk forwards
    # (schedules.py get_pp_rank_microbatches), + 1 in the steady state; each chunk is 1/vpp of the stage
    chunks = min(micro_batches * lay.vpp, (lay.pp - 1) * 2 + (lay.vpp - 1) * lay.pp + 1)
    return per_micro, chunks / lay.vpp


@dataclass(frozen=True, slots=True)
class _Activations:
    stored: int
    """Saved for backward, every micro-batch in flight, at the start of backward."""
    loss: int
    """The loss's vocabulary-wide fp32 tensors at its backward (last stage)."""
    recomputing: int
    """One recomputed group's activations during backward."""
    dispatch: int
    """MoE token-dispatch buffers of the layer being computed."""
    how: str


def _activations(scenario: Scenario, dims: ModelDims, traits: MemoryTraits, share: _Share,
                 first_stage: bool) -> _Activations:
    lay, wl = scenario.layout, scenario.workload
    rows = wl.batch_size // lay.dp
    per_micro, in_flight = _in_flight(scenario, traits, rows, first_stage)
    tokens = per_micro * wl.seq_len / (lay.cp * lay.ulysses)
    act_bytes = WEIGHT_BYTES[scenario.dtype]
    recompute = _recompute(scenario, traits)
    on_cpu = scenario.device == "cpu"
    materialised = on_cpu and traits.cpu_attention_matrix
    per_layer, layer_input = _layer_elements(dims, scenario, wl.seq_len // lay.cp, materialised)
    if on_cpu:
        per_layer *= traits.cpu_layer_factor
    layers = share.layers
    if recompute.full_groups:
        kept = math.ceil(layers / recompute.full_groups) * layer_input
        recomputing = min(recompute.full_groups, layers) * per_layer  # one group rebuilt during backward
    elif recompute.block:
        block = min(recompute.block, layers)
        kept, recomputing = block * layer_input + (layers - block) * per_layer, per_layer
    else:
        kept, recomputing = layers * per_layer, 0.0
    last_stage = lay.pp == 1 or not first_stage
    scored = tokens * (wl.response_len / wl.seq_len if traits.scored == "response" else 1)
    loss = scored * dims.vocab * FP32 * LOSS_VOCAB_COPIES if last_stage else 0
    dispatch = 2 * tokens * dims.topk * dims.hidden / lay.tp * act_bytes if dims.experts else 0
    how = f"{in_flight:g} micro-batch(es) of {per_micro} row(s) in flight"
    if recompute.what:
        how += f", {recompute.what}"
    return _Activations(int(tokens * act_bytes * kept * in_flight), int(loss),
                        int(tokens * act_bytes * recomputing), int(dispatch), how)


# ---- loading ---------------------------------------------------------------------------------------------------
def _load(scenario: Scenario, dims: ModelDims, how: str, share: _Share) -> tuple[int, int, str]:
    """(device bytes, host bytes on the node, what) at the load-time peak for one loading path. Weights load in
    fp32 (the engines' and verl's FSDP master dtype) unless the engine keeps 16-bit weights (Megatron)."""
    lay = scenario.layout
    largest = dims.largest_tensor
    if how == "replicated":
        return (FP32 * dims.total, FP32 * dims.total * lay.ranks_per_node,
                "every rank loads the whole model, then shards")
    if how == "rank0_broadcast":
        return (FP32 * (share.params + largest), FP32 * dims.total,
                "rank 0 reads on the host, each tensor broadcast then sharded")
    weight_bytes = WEIGHT_BYTES[scenario.dtype] if share.master_weights else FP32
    return (weight_bytes * share.params + FP32 * largest // max(lay.tp, 1), FP32 * largest * lay.ranks_per_node,
            "each rank reads only its shard's tensors")


# ---- the plan --------------------------------------------------------------------------------------------------
def estimate(scenario: Scenario, config: dict[str, Any], traits: MemoryTraits | None = None) -> MemoryPlan:
    """The per-rank memory plan of `scenario` for a model with this HF config (the larger pipeline end stage)."""
    return max(stage_plans(scenario, config, traits), key=lambda p: p.total)


def stage_plans(scenario: Scenario, config: dict[str, Any], traits: MemoryTraits | None = None) -> list[MemoryPlan]:
    """The plans of the first and (with pp > 1) the last pipeline stage: the first holds the most micro-batches
    in flight, the last the loss."""
    traits = traits or spec_for(scenario).memory
    return [_stage_plan(scenario, config, traits, first) for first in ((True, False) if scenario.layout.pp > 1
                                                                       else (True,))]


def _stage_plan(scenario: Scenario, config: dict[str, Any], traits: MemoryTraits, first_stage: bool) -> MemoryPlan:
    dims = param_counts(config)
    share = _rank_share(scenario, dims, traits, first_stage)
    weight_bytes = WEIGHT_BYTES[scenario.dtype] if share.master_weights or scenario.dtype == "fp32" else FP32
    optimizer_bytes = ADAM_BYTES + (MASTER_BYTES if share.master_weights else 0)
    offloaded = traits.sharding == "fully_sharded" and _fsdp_offload(scenario)
    weights = 0 if offloaded else weight_bytes * share.params
    grads = 0 if offloaded else GRAD_BYTES * share.params
    optimizer = optimizer_bytes * share.optimizer_params
    act = _activations(scenario, dims, traits, share, first_stage)
    buffer = grads if traits.grad_buffer else 0
    gathered = share.layer * WEIGHT_BYTES[scenario.dtype]  # FSDP: the layer being computed, unsharded
    step_temporaries = 2 * FP32 * min(dims.largest_tensor, share.params) if share.optimizer_params else 0
    train = weights + optimizer + max(
        buffer + act.stored + act.loss + act.dispatch + gathered,  # the start of backward
        buffer + act.stored + act.recomputing + gathered,  # a recomputed group during backward
        grads + share.layer * GRAD_BYTES + step_temporaries)  # every gradient, one unsharded; the step
    load, host, load_how = _load(scenario, dims, traits.load, share)
    verl_load = None
    if traits.load == "replicated" and traits.sharding == "fully_sharded":
        verl_load = _load(scenario, dims, "rank0_broadcast", share)[0]
    model = planning_model(scenario.device) if scenario.device != "cpu" else None
    return MemoryPlan(params=share.params, weights=weights, grads=grads, optimizer=optimizer,
                      activations=act.stored, loss=act.loss, train=train, load=load, load_how=load_how,
                      host_load=host, in_flight=act.how, verl_load=verl_load,
                      hbm_bytes=model.hbm_bytes if model else None, card=model.match if model else None)


def plan_for(scenario: Scenario) -> MemoryPlan | None:
    """The plan, or None when the model's config cannot be read here (an unset $PATH variable)."""
    config = model_config(scenario.model)
    return estimate(scenario, config) if config is not None else None


def with_load(traits: MemoryTraits, load: str) -> MemoryTraits:
    """The same engine traits with another loading path (what-if plans, tests)."""
    return replace(traits, load=load)
