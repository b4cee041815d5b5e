"""Typed scenario configuration: what one parity run is.

Parsed with pydantic (`extra="forbid"`) so that a typo is an error, never a silently ignored key.
Cross-field rules that need no model config live here; rules that need the model's shape live in
`parity.harness.config.validate`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

Dtype = Literal["fp32", "bf16", "fp16"]
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
Device = Literal["cpu", "cuda", "npu"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def model_label(model: str) -> str:
    """Id part for a model, stable whatever the environment: 'tiny-qwen3', '/ckpt/Qwen3-8B' -> 'Qwen3-8B',
    '$QWEN3_8B_PATH' -> 'qwen3-8b'."""
    last = model.rstrip("/").rsplit("/", 1)[-1]
    if last.startswith("$"):
        var = last.strip("${}")
        for suffix in ("_PATH", "_DIR"):
            var = var.removesuffix(suffix)
        return var.lower().replace("_", "-")
    return last


class Layout(_Strict):
    """Parallel layout. World size = dp * tp * pp * cp * ulysses; ep and etp borrow from it."""

    dp: int = Field(1, ge=1)
    """Data-parallel (for fsdp2: fully-shard) degree."""
    tp: int = Field(1, ge=1)
    """Tensor-parallel degree."""
    pp: int = Field(1, ge=1)
    """Pipeline-parallel degree."""
    vpp: int = Field(1, ge=1)
    """Virtual pipeline stages per pipeline rank (interleaved 1F1B); 1 = off."""
    cp: int = Field(1, ge=1)
    """Context-parallel degree (Megatron CP)."""
    ep: int = Field(1, ge=1)
    """Expert-parallel degree (borrowed from dp*cp*tp/etp, as in Megatron-Core)."""
    etp: int = Field(1, ge=1)
    """Expert tensor-parallel degree."""
    sequence_parallel: bool = False
    """Megatron sequence parallel (needs tp > 1)."""
    ulysses: int = Field(1, ge=1)
    """Ulysses sequence-parallel degree (fsdp2, as verl's FSDP backend does it)."""
    nodes: int = Field(1, ge=1)
    """Number of nodes the world spans."""
    nproc_per_node: int | None = Field(None, ge=1)
    """Ranks per node; default world_size / nodes."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp * self.ulysses

    @property
    def ranks_per_node(self) -> int:
        return self.nproc_per_node or max(1, self.world_size // self.nodes)

    def tag(self) -> str:
        """Readable id part: the non-trivial degrees, e.g. 'tp2-pp2-sp' or 'single'."""
        parts = [f"{name}{getattr(self, name)}" for name in ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "ulysses")
                 if getattr(self, name) > 1]
        if self.sequence_parallel:
            parts.append("sp")
        if self.nodes > 1:
            parts.append(f"{self.nodes}nodes")
        return "-".join(parts) or "single"

    @model_validator(mode="after")
    def _check_world(self) -> Layout:
        if self.nodes * self.ranks_per_node != self.world_size:
            raise ValueError(
                f"nodes({self.nodes}) * nproc_per_node({self.ranks_per_node}) != world size {self.world_size} "
                f"= dp({self.dp}) * tp({self.tp}) * pp({self.pp}) * cp({self.cp}) * ulysses({self.ulysses})")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1 (Megatron splits the sequence over the TP group)")
        if (self.ep * self.etp) > 1 and (self.dp * self.cp * self.tp) % (self.ep * self.etp):
            raise ValueError(f"ep({self.ep}) * etp({self.etp}) must divide dp({self.dp}) * cp({self.cp}) * "
                             f"tp({self.tp}) = {self.dp * self.cp * self.tp}")
        return self


#: Workload fields of the learning-rate schedule and weight decay groups, left out of the serialized workload at their
#: defaults (the content hash of every row that predates them is unchanged)
SCHEDULE_FIELDS = ("weight_decay_exempt", "lr_warmup_steps", "lr_warmup_steps_ratio", "lr_scheduler_type",
                   "min_lr_ratio")
#: Workload fields of verl's RL step (its actor's and algorithm's keys), likewise left out at their defaults
RL_STEP_FIELDS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "policy_loss", "mini_batches",
                  "mini_batch_shards", "ppo_epochs", "adv_estimator", "use_kl_loss", "kl_loss_coef", "kl_loss_type")


class Workload(_Strict):
    """The fixed, seeded batch and the training steps every engine runs."""

    batch_size: int = Field(4, ge=1)
    """Sequences in the global batch."""
    prompt_len: int = Field(16, ge=1)
    """Prompt tokens per row (left-padded)."""
    response_len: int = Field(16, ge=1)
    """Response tokens per row (right-padded)."""
    min_prompt_len: int | None = Field(None, ge=1)
    """Shortest real prompt; rows get seeded lengths in [min, prompt_len]. Default prompt_len // 2."""
    min_response_len: int | None = Field(None, ge=1)
    """Shortest real response; default response_len // 2."""
    seed: int = 1234
    """Seeds token ids, lengths, advantages and model init."""
    steps: int = Field(2, ge=1)
    """Optimizer steps after the first forward."""
    loss: Literal["grpo", "sft"] = "grpo"
    """grpo: PPO-clip policy loss on the batch's advantages (+ entropy bonus); sft: token cross-entropy."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How per-token losses become one number, in verl's names (verl/trainer/ppo/core_algos.py agg_loss):
    token-mean over the global batch's tokens, token-sum, seq-mean-token-sum (each sequence's token sum, averaged
    over sequences), seq-mean-token-mean (each sequence's token mean, averaged), seq-mean-token-sum-norm
    (seq-mean-token-sum / response_len). Engines state which they implement (EngineSpec.loss_agg_modes)."""
    clip_ratio: float = Field(0.2, gt=0)
    """PPO clip epsilon."""
    entropy_coeff: float = Field(0.01, ge=0)
    """Entropy bonus weight: makes step-1 grpo loss depend on the model (ratio is exactly 1 there)."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-4, gt=0)
    """Small on purpose: Adam moves every weight by ~lr on step 1 whatever the gradient, so a large lr turns
    bf16 rounding of near-zero gradients into large after-step differences."""
    grad_clip: float = Field(1.0, gt=0)
    """Max grad norm. The harness compares the norm BEFORE clipping."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay (AdamW's; SGD's is coupled), at every step of the schedule (verl's
    `actor.optim.weight_decay`; Megatron's scheduler keeps it constant: `weight_decay_incr_style: constant`)."""
    weight_decay_exempt: Literal["none", "biases_and_norms"] = "none"
    """Which parameters weight decay leaves alone. none: every parameter decays (torch.optim.AdamW over
    model.parameters(), as verl's FSDP engine builds it: verl/workers/config/optimizer.py build_optimizer).
    biases_and_norms: biases and 1-D parameters (norm weights, Qwen3's q/k norms) do not — Megatron's default
    param groups (megatron/core/optimizer/__init__.py get_standard_config_overrides: `*.bias` or len(shape) == 1
    get wd_mult 0; `no_weight_decay_cond`'s default before 0.16), which verl's Megatron engine uses."""
    lr_warmup_steps: int = -1
    """verl's `actor.optim.lr_warmup_steps`: linear warmup from 0 over this many updates; <= 0 takes
    lr_warmup_steps_ratio instead (parity.harness.contract.schedule)."""
    lr_warmup_steps_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """verl's `actor.optim.lr_warmup_steps_ratio`: warmup = int(ratio * steps) when lr_warmup_steps <= 0."""
    lr_scheduler_type: Literal["constant", "cosine", "linear"] = "constant"
    """verl's `actor.optim.lr_scheduler_type` (Megatron: `lr_decay_style`) after the warmup: constant, cosine
    down to min_lr_ratio * lr at the last step (a half cosine), or linear down to 0 (the reference's linear
    scheduler, transformers' get_linear_schedule_with_warmup, has no floor). parity.harness.contract.schedule
    states each as a function of the step."""
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """verl's `actor.optim.min_lr_ratio`: the cosine's floor as a fraction of lr (Megatron: min_lr = ratio * lr)."""
    advantages: Literal["seeded", "group_normalized"] = "seeded"
    """seeded: one seeded advantage per row, independent of the rest (the step-1 grpo loss is then mostly
    -mean(A), a term no engine computes). group_normalized: GRPO's, as verl computes them: rows come in groups of
    `group_size` responses to one shared prompt, each with a seeded scalar reward, and A = (r - mean_group) /
    (std_group + 1e-6); responses of a group have one length, so the advantage term of the step-1 loss cancels."""
    group_size: int | None = Field(None, ge=2)
    """Responses per prompt (verl's `actor_rollout_ref.rollout.n`): group_normalized, or an adv_estimator that
    groups (grpo, rloo); divides batch_size."""
    clip_ratio_low: float | None = Field(None, gt=0)
    """verl's `actor.clip_ratio_low`: the ratio's lower clip is 1 - this (None: clip_ratio)."""
    clip_ratio_high: float | None = Field(None, gt=0)
    """verl's `actor.clip_ratio_high` (DAPO's clip-higher): the upper clip is 1 + this (None: clip_ratio)."""
    clip_ratio_c: float = Field(3.0, gt=1)
    """verl's `actor.clip_ratio_c`: the dual clip's bound for negative advantages (verl's default 3.0; the
    vanilla loss applies it always: verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla)."""
    policy_loss: Literal["vanilla", "gspo", "clip_cov", "kl_cov"] = "vanilla"
    """verl's `actor.policy_loss.loss_mode` (its policy-loss registry, core_algos.register_policy_loss)."""
    mini_batches: int = Field(1, ge=1)
    """Optimizer updates per step: the global batch split in order into this many mini-batches (verl's
    `actor.ppo_mini_batch_size` = batch_size / mini_batches / group_size prompts; `actor.shuffle: false`). Loss
    and pre-clip grad norm are recorded per update; the learning-rate scheduler steps once per step."""
    mini_batch_shards: int = Field(1, ge=1)
    """How a mini-batch is drawn from the step's batch: cut into this many consecutive shards, the u-th
    mini-batch is every shard's u-th slice (verl's single controller hands each data-parallel rank one consecutive
    chunk and each rank cuts its own into mini-batches: verl/workers/engine_workers.py TrainingWorker.
    train_mini_batch); 1: consecutive rows. The verl engines set it to their data-parallel size."""
    ppo_epochs: int = Field(1, ge=1)
    """verl's `actor.ppo_epochs`: passes over the step's mini-batches, each against the step's old log-probs."""
    adv_estimator: Literal["grpo", "rloo", "reinforce_plus_plus", "gae"] | None = None
    """verl's `algorithm.adv_estimator`: the rows carry one seeded scalar reward each (Batch.rewards) and the
    trainer computes the advantages from them (verl: core_algos.compute_advantage); None: the batch's own
    `advantages`. gae needs a critic."""
    use_kl_loss: bool = False
    """verl's `actor.use_kl_loss`: add kl_loss_coef * KL(policy || reference policy) to the loss, the reference
    policy being the step-0 weights (verl's ref worker)."""
    kl_loss_coef: float = Field(0.001, ge=0)
    """verl's `actor.kl_loss_coef`."""
    kl_loss_type: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] = "low_var_kl"
    """verl's `actor.kl_loss_type` (core_algos.kl_penalty)."""
    packing: Literal["padded", "packed"] = "padded"
    """How the engine feeds the SAME seeded rows to its model. padded: [B, S] rows, left-padded prompts and
    right-padded responses with an explicit mask (the HF-style path). packed: each row's real tokens only,
    concatenated, position ids restarting at 0 per sequence — verl's `use_remove_padding` (FSDP: transformers'
    packed-sequence attention; Megatron: THD with PackedSeqParams, each sequence padded to a multiple of tp*cp*2;
    MindSpeed: TND through npu_fusion_attention). Either way the reference is the same padded fp32 run
    (`padded()`), so the two rows of one engine sit side by side."""

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def packed(self) -> bool:
        return self.packing == "packed"

    def padded(self) -> Workload:
        """The same rows fed padded: what a packed run is compared with (the reference and baselines)."""
        return self.model_copy(update={"packing": "padded"}) if self.packed else self

    @model_serializer(mode="wrap")
    def _omit_default_advantages(self, handler: Any) -> dict[str, Any]:
        """Fields added after the first release are left out at their defaults, so the content hash (and every
        cached reference) of a workload that predates them stays the same."""
        data = handler(self)
        if self.advantages == "seeded" and self.group_size is None:
            data.pop("advantages", None)
            data.pop("group_size", None)
        if self.loss_agg_mode == "token-mean":
            data.pop("loss_agg_mode", None)
        if self.packing == "padded":
            data.pop("packing", None)
        for name in SCHEDULE_FIELDS + RL_STEP_FIELDS:
            if data.get(name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data

    @model_validator(mode="after")
    def _check_lengths(self) -> Workload:
        if self.min_prompt_len is not None and self.min_prompt_len > self.prompt_len:
            raise ValueError(f"min_prompt_len({self.min_prompt_len}) > prompt_len({self.prompt_len})")
        if self.min_response_len is not None and self.min_response_len > self.response_len:
            raise ValueError(f"min_response_len({self.min_response_len}) > response_len({self.response_len})")
        grouped = self.advantages == "group_normalized" or self.adv_estimator in ("grpo", "rloo")
        if grouped and self.group_size is None:
            raise ValueError(f"advantages {self.adv_estimator or self.advantages} need group_size (responses per "
                             "prompt)")
        if self.group_size is not None:
            if self.advantages != "group_normalized" and self.adv_estimator is None:
                raise ValueError("group_size applies to advantages: group_normalized or an adv_estimator only")
            if self.batch_size % self.group_size:
                raise ValueError(f"batch_size({self.batch_size}) is not divisible by group_size({self.group_size})")
        return self

    @model_validator(mode="after")
    def _check_rl_step(self) -> Workload:
        if self.adv_estimator is not None and self.advantages != "seeded":
            raise ValueError(f"adv_estimator {self.adv_estimator} computes the advantages from seeded rewards; "
                             f"leave `advantages` at its default (not {self.advantages})")
        if self.loss == "sft" and any(
                getattr(self, name) != type(self).model_fields[name].default for name in RL_STEP_FIELDS):
            raise ValueError("the RL step's settings (clip ratios, policy_loss, mini_batches, ppo_epochs, "
                             "adv_estimator, KL loss) apply to loss: grpo only")
        slices = self.mini_batches * self.mini_batch_shards
        rows = self.batch_size // slices
        if self.batch_size % slices:
            raise ValueError(f"batch_size({self.batch_size}) is not divisible by mini_batches({self.mini_batches})"
                             f" x mini_batch_shards({self.mini_batch_shards})")
        if self.group_size is not None and rows % self.group_size:
            raise ValueError(f"a mini-batch slice of {rows} rows splits a group of {self.group_size}: batch_size / "
                             "(mini_batches x mini_batch_shards) must be a multiple of group_size")
        return self

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates in one training step (ppo_epochs passes over mini_batches mini-batches)."""
        return self.mini_batches * self.ppo_epochs

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high

    @model_validator(mode="after")
    def _check_schedule(self) -> Workload:
        from parity.harness.contract.schedule import warmup_steps

        warmup = warmup_steps(self)
        if warmup and warmup >= self.steps:
            raise ValueError(f"the warmup ({warmup} steps) must end before the last step ({self.steps}): Megatron's "
                             "scheduler asserts lr_warmup_steps < lr_decay_steps (the run's steps)")
        if self.min_lr_ratio and self.lr_scheduler_type != "cosine":
            raise ValueError(f"min_lr_ratio applies to lr_scheduler_type cosine only (constant never decays; the "
                             f"reference's linear decays to 0), not {self.lr_scheduler_type}")
        return self


class Tolerance(_Strict):
    """Per-metric limits; unset fields take the dtype default (see docs/tolerances.md)."""

    logprob_max_abs: float | None = None
    """Log-prob (and entropy) max |Δ| before training; also after it where `logprob_max_abs_updated` is unset."""
    logprob_mean_abs: float | None = None
    logprob_p99_abs: float | None = None
    kl_k3: float | None = None
    logprob_max_abs_updated: float | None = None
    """The same after the optimizer's updates (the last step's log-probs, a resumed or converted checkpoint's):
    the weights then carry each update's rounding in low precision; unset = the before-training limit."""
    logprob_mean_abs_updated: float | None = None
    logprob_p99_abs_updated: float | None = None
    kl_k3_updated: float | None = None
    loss_rel: float | None = None
    """rtol of `|c - r| <= atol + rtol * |r|` for the per-step loss."""
    loss_atol: float | None = None
    """atol of the same check: the loss error allowed however close to zero the reference loss is."""
    grad_norm_rel: float | None = None
    grad_norm_atol: float | None = None
    group_grad_norm_rel: float | None = None
    """rtol of the per-module (parameter group) pre-clip grad norm check; fp32 default 1e-4, not compared in bf16."""
    group_grad_norm_atol: float | None = None
    group_sum_rel: float | None = None
    """The candidate against itself: its pre-clip grad norm against the root-sum-square of its own per-module grad
    norms, |G - sqrt(sum g_i^2)| / sqrt(sum g_i^2), every step (harness/judge/groups.py group_sum_checks)."""
    """Its atol, as a fraction of the reference's global grad norm at that step (default 1e-6)."""
    loss_rel_updated: float | None = None
    """rtol of the loss check from step 2 on (after the first optimizer update); unset = the dtype default."""
    loss_atol_updated: float | None = None
    grad_norm_rel_updated: float | None = None
    """rtol of the pre-clip grad norm check from step 2 on."""
    grad_norm_atol_updated: float | None = None
    ratio_median: float | None = None
    """Three-way lane: limit on candidate-error / baseline-error for the median |Δ| of log-probs and entropy."""
    ratio_mean: float | None = None
    """Three-way lane, opt-in: the same limit for mean |Δ| (MoE routing flips make it noisy; docs/tolerances.md)."""
    ratio_max: float | None = None
    """Three-way lane, opt-in: the same limit for max |Δ| (one draw per run: heavy-tailed)."""
    loss_rel_baseline_step1: float | None = None
    """Three-way lane: the step-1 loss against the same-recipe baseline's, |c - b| <= rel |b| + 1e-6 (the same
    weights and recipe, before any update): a loss scaled by a normaliser a few tokens off, which the bar against
    fp32 (`loss_rel`) lets through in bf16 (bf16 default: docs/tolerances.md)."""
    grad_norm_rel_baseline_step1: float | None = None
    """Three-way lane: the step-1 pre-clip grad norm against the same-recipe baseline's (the same weights, the same
    recipe, before any update: two implementations of one bf16 step), |c - b| / |b|. Far tighter than against fp32,
    whose rounding gap to bf16 hides a small gradient scale (bf16 default per row class: docs/tolerances.md)."""
    group_grad_norm_rel_baseline_step1: float | None = None
    """Three-way lane: each module's (parameter group's) step-1 pre-clip grad norm against the baseline's, as above."""
    common_grad_scale_baseline_step1: float | None = None
    """Three-way lane: |median over modules of the step-1 module grad norm ratio to the baseline's - 1|, the scale
    every module shares (a loss or gradient normalisation off by a percent), which a MoE router's bf16 top-k flips
    hide in the whole gradient's norm (harness/judge/baseline_step1.py common_grad_scale)."""
    expert_load_abs: float | None = None
    """Opt-in, MoE: the most tokens one expert of one layer may receive more or fewer than in the reference, per
    step, as the router's load statistics count them (StepOutput.expert_load: real tokens only). 0 = the same
    routing token for token; a near-tie of two experts' router logits may flip one token in fp32."""
    loss_rel_per_step: float | None = None
    """A long run's band: rtol added to the loss check per step after the first (rtol + (k - 1) x this; default 0,
    calibrated over seeds for the long lane: docs/tolerances.md)."""
    grad_norm_rel_per_step: float | None = None
    """The same band for the pre-clip grad norm."""
    group_grad_norm_rel_per_step: float | None = None
    """The same band for the per-module grad norms."""
    ratio_step_median: float | None = None
    """Three-way lane, opt-in (long runs): limit on the per-step loss / grad-norm error over the baseline's, each a
    median over `ratio_step_window` steps (one step's ratio is one draw)."""
    ratio_step_window: int | None = Field(None, ge=1)
    """Steps per window of ratio_step_median (default 10)."""
    lr_rel: float | None = None
    """The learning rate each step ran at against the workload's schedule, |Δ| / lr (default 1e-6)."""


class PerfGate(_Strict):
    """Performance limits against this scenario's history (`--history DIR ...`: earlier runs' out dirs); a breach
    FAILs the scenario or only warns, as on_breach says."""

    max_slowdown: float | None = Field(None, gt=0)
    """Largest allowed step-time growth over the history's median, e.g. 0.05 = 5 %."""
    max_memory_growth: float | None = Field(None, gt=0)
    """Largest allowed peak-memory growth (worst rank) over the history's median."""
    on_breach: Literal["fail", "warn"] = "fail"
    timed_steps: int = Field(5, ge=5)
    """Extra training steps timed after the judged ones (the workload's steps and the after-step forward are
    unchanged): the step time a gate compares is their median, with their spread, not one warm step."""


FaultKind = Literal["grad_scale", "rank_loss_scale", "rope_theta_int", "mask_shift", "local_token_norm",
                    "loss_normalizer_scale",
                    "tp_allreduce_skip", "pp_stage_grad_scale", "qkv_interleave", "tp_grad_reduce_skip",
                    "crash", "hang", "drop_kwarg", "nondeterministic", "module_grad_scale", "optimizer_step_skip",
                    # the packed (THD / TND) data path: docs/scenarios.md says where each lives
                    "packed_position_ids_continue", "cu_seqlens_shift", "thd_cp_chunk_order",
                    "pad_tokens_in_normalizer", "moe_pad_tokens_routed",
                    # the schedule, the engine's own checkpoint and its conversion to HF (docs/scenarios.md)
                    "lr_warmup_ignored", "lr_scheduler_double_step", "weight_decay_on_norms",
                    "resume_adam_moments_zeroed", "converter_qk_swap", "converter_tied_embedding_dropped",
                    # Megatron's vocab-parallel log-probs (engines/megatron/engine.py _real_vocab)
                    "vocab_padding_in_softmax"]


class Fault(_Strict):
    """A deliberate defect a scenario switches on to prove the harness catches it."""

    kind: FaultKind
    step: int | None = None
    """Training step (1-based) the fault hits; None = every step."""
    rank: int | None = None
    """Rank the fault hits; None = every rank."""
    factor: float = 2.0
    """Scale for grad_scale / rank_loss_scale / pp_stage_grad_scale (0 drops the contribution) /
    loss_normalizer_scale (the loss's token count times it)."""
    key: str | None = None
    """For drop_kwarg: the engine kwarg that is silently not applied. For module_grad_scale: the parameter group
    (HF naming, e.g. layers.1.self_attn.o_proj) whose gradients are scaled."""


Reference = Literal["hf_fp32", "single_rank"]


class Resume(_Strict):
    """Resume parity: train `after` steps, save the engine's own checkpoint (Engine.save_checkpoint), continue the
    remaining steps in FRESH processes from it (Engine.load_checkpoint), possibly on another layout, and compare
    with the same engine's uninterrupted run (and, as every run, with the reference)."""

    after: int = Field(ge=1)
    """Steps trained before the checkpoint is saved; the run continues from step after + 1."""
    layout: Layout | None = None
    """The layout the run continues on (dist-ckpt reshards, e.g. tp2 -> pp2); default: the scenario's."""
    exact: bool | None = None
    """Whether the continuation must be bit-identical to the uninterrupted run. Default: yes on the same layout
    (the same program from the same state: a save/load round trip of the state is exact), no on another layout
    (its rounding differs: the scenario's limits apply)."""


class Scenario(_Strict):
    """One expanded scenario: a model under one engine and layout, compared with one reference."""

    model: str
    """Built-in tiny architecture (tiny-llama, ...) or a local HF checkpoint directory ($VARS expand)."""
    strategy: str | None = None
    """Built-in engine: hf, fsdp2, megatron, mindspeed_megatron, mindspeed_fsdp."""
    engine: str | None = None
    """Third-party engine by import path 'package.module:Class' (instead of strategy)."""
    layout: Layout = Layout()
    workload: Workload = Workload()
    dtype: Dtype = "fp32"
    device: Device = "cpu"
    reference: Reference | str = "hf_fp32"
    """hf_fp32 (default), single_rank (same engine on one rank), or 'golden:DIR' (a stored RunRecord)."""
    baseline: str | None = None
    """Three-way lane: judge candidate-error / baseline-error, both against the fp32 reference. Name the recipe the
    candidate follows: `hf_master_weights` = low-precision weights cast from fp32 masters that the optimizer steps
    (FSDP2's MixedPrecisionPolicy(param_dtype=bf16), Megatron's and MindSpeed's recipe); `hf` = torch.autocast
    over fp32 weights (HF Trainer / Accelerate's recipe). A baseline of the other recipe is a different, looser bar
    (docs/tolerances.md). The names are the reference engine's (EngineSpec.reference)."""
    tolerance: Tolerance = Tolerance()
    perf: PerfGate | None = None
    """Performance gate against earlier runs (see PerfGate)."""
    timeout: float = Field(300.0, gt=0)
    """Seconds before the run is killed with all its processes."""
    marks: tuple[str, ...] = ()
    """pytest markers, e.g. nightly, pr."""
    broken: str | None = None
    """Known broken: listed and collected, not run (like Megatron's mr-broken scope); the reason."""
    mcore_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Passed to Megatron TransformerConfig / DDP / optimizer settings."""
    fsdp_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Passed to the FSDP engine (fully_shard / mixed precision settings)."""
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Passed to a third-party engine."""
    actor_rollout_ref: dict[str, Any] = Field(default_factory=dict)
    """verl's own `actor_rollout_ref` config tree (its `actor` and `model` sections, verbatim, nested or as dotted
    keys) for the verl engines, which hand it to verl's config; stored flat, one dotted key per leaf."""
    faults: tuple[Fault, ...] = ()
    resume: Resume | None = None
    """Resume parity through the engine's own checkpoint (see Resume)."""
    convert: bool = False
    """Conversion parity: after the last step the engine saves its checkpoint, the engine's converter turns it into
    an HF checkpoint (Engine.convert_checkpoint), and plain transformers' log-probs of it must equal the engine's own
    after-training log-probs (the scenario's log-prob limits)."""
    repeat: int = Field(1, ge=1)
    """Deterministic lane: run the candidate this many times; its log-probs, losses and grad norms must be
    bit-identical across the runs."""
    name: str | None = None
    """Optional suffix that makes the id unique (e.g. 'alltoall')."""
    source: str | None = Field(None, exclude=True)
    """File the scenario came from (set by the loader)."""

    @field_validator("reference")
    @classmethod
    def _check_reference(cls, value: str) -> str:
        if value not in ("hf_fp32", "single_rank") and not value.startswith("golden:"):
            raise ValueError(f"unknown reference '{value}': use hf_fp32, single_rank or golden:DIR")
        return value

    @model_validator(mode="after")
    def _check_engine(self) -> Scenario:
        if (self.strategy is None) == (self.engine is None):
            raise ValueError("give exactly one of 'strategy' (built-in engine) or 'engine' (import path)")
        if self.engine is not None and ":" not in self.engine:
            raise ValueError(f"engine '{self.engine}' must be an import path 'package.module:Class'")
        if self.resume is not None and self.resume.after >= self.workload.steps:
            raise ValueError(f"resume.after({self.resume.after}) must be before the last step "
                             f"(workload.steps {self.workload.steps}): the run continues from step after + 1")
        if self.resume is not None and self.resume.layout is not None and self.resume.layout.nodes != self.layout.nodes:
            raise ValueError("resume.layout must keep the scenario's nodes")
        return self

    @property
    def resume_layout(self) -> Layout:
        """The layout a resumed run continues on."""
        return self.resume.layout if self.resume is not None and self.resume.layout is not None else self.layout

    @property
    def resume_exact(self) -> bool:
        """Whether a resumed run must be bit-identical to the uninterrupted one (Resume.exact)."""
        if self.resume is None or self.resume.exact is not None:
            return bool(self.resume and self.resume.exact)
        return self.resume_layout == self.layout

    @property
    def engine_label(self) -> str:
        return self.strategy or (self.engine or "").rsplit(":", 1)[-1]

    @property
    def id(self) -> str:
        parts = [model_label(self.model), self.engine_label, self.layout.tag(), self.dtype,
                 self.device]
        suffix = "+packed" if self.workload.packed else ""
        suffix += "".join(f"+{f.kind}" for f in self.faults)
        if self.resume is not None:
            moved = self.resume_layout != self.layout
            suffix += f"+resume{self.resume.after}" + (f"-to-{self.resume_layout.tag()}" if moved else "")
        if self.convert:
            suffix += "+convert"
        if self.baseline:
            suffix += f"+vs-{self.baseline}"
        if self.name:
            suffix += f"+{self.name}"
        return "/".join(parts) + suffix

    def content_hash(self) -> str:
        """Stable hash of everything that changes the run (not marks, timeout or source)."""
        data = self.model_dump(mode="json", exclude={"marks", "timeout", "source", "broken", "tolerance",
                                                         "perf"})
        for name in ("resume", "convert"):  # added later: out at their defaults, so older hashes stay
            if data.get(name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
