"""What the harness knows about verl's config keys, stated once, torch-free and verl-free: scenario parsing
(engines/verl/vocabulary.py, both spellings) and validation read it before anything is imported;
engines/verl/readback.py implements the named read-backs.

A verl scenario carries verl's own `actor_rollout_ref` tree (its `actor`, `model` and `ref` sections) verbatim. Three
kinds of key:
- keys that restate a scenario field (`actor.optim.lr` is `workload.lr`): given in the verl tree they set the
  field, given in both they must agree, given in neither the field's value is written into the verl tree;
- keys the harness verifies after the run, each by a named read-back of what verl built or did;
- keys the harness refuses away from one value, with the reason (the reference cannot follow them, or nothing
  here could tell whether verl applied them). A key left at verl's own default needs no read-back: a drop could
  not change anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parity.engines.megatron.spec import MEGATRON_LAYOUT_KEYS
from parity.harness.contract.schema import RL_STEP_FIELDS

BLOCK = "actor_rollout_ref"
SECTIONS = ("actor", "model", "ref")
"""The parts of verl's actor_rollout_ref tree the candidate reads: the actor's engine, the model, and the ref
worker's engine (it scores the KL loss's reference log-probs, use_kl_loss). The rollout is not under test."""

#: verl dtype spellings (verl/utils/torch_dtypes.py PrecisionType) -> the scenario's
DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "32": "fp32", "bf16": "bf16", "bfloat16": "bf16",
               "fp16": "fp16", "float16": "fp16", "16": "fp16"}
#: scenario dtype -> the spelling written into verl's config (McoreEngineConfig.dtype accepts only these)
VERL_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: verl's model.use_remove_padding <-> the scenario's workload.packing (verl packs the rows it is given)
PACKING = {True: "packed", False: "padded"}


@dataclass(frozen=True, slots=True)
class ReadBack:
    """How the harness verifies one verl key after the run."""

    rule: str
    """Name of the function in engines/verl/readback.py RULES."""
    what: str
    """What is read, for docs and failure messages."""
    dropped_in: str = ""
    """verl's file where a known drop of this key happens (named when it FAILs)."""
    role: str = "actor"
    """The worker whose built objects the rule reads: 'actor', or 'ref' for the ref section's keys."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A key the harness takes at one value only."""

    allowed: Any
    why: str


@dataclass(frozen=True, slots=True)
class EngineKeys:
    """One verl engine's key table."""

    backends: tuple[str, ...]
    """The `actor.strategy` values this engine builds (verl's EngineRegistry backend names)."""
    shared: Mapping[str, str]
    """verl key -> the scenario field it restates ('workload.lr', 'layout.tp', 'dtype')."""
    read_back: Mapping[str, ReadBack]
    """verl key (or 'prefix.*' for the keys of a dict-typed field) -> its read-back."""
    refused: Mapping[str, Refused]
    verl_none: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """shared verl key -> the scenario value verl spells None (Megatron's vpp None is the scenario's vpp 1)."""
    quiet_defaults: frozenset[str] = frozenset()
    """Shared keys written into verl's config only away from the scenario field's default, which is verl's own
    default too: a row that predates them keeps its verl tree, hence its content hash."""

    def read_back_for(self, key: str) -> ReadBack | None:
        if key in self.read_back:
            return self.read_back[key]
        for pattern, rule in self.read_back.items():
            if pattern.endswith(".*") and key.startswith(pattern[:-1]):
                return rule
        return None


# ---- keys both engines share -------------------------------------------------------------------------------
_NUMERIC = ("the actor config verl's loss function (ppo_loss) was called with; its effect is checked by the per-update "
            "loss against the reference")
_POLICY_LOSS = ("the arguments the policy-loss function verl's registry returned was called with (its config's clip "
                "ratios, its loss_agg_mode), every call")

#: the schedule keys every verl optimizer config has (verl/workers/config/optimizer.py OptimizerConfig): warmup, as
#: the workload's. The decay is per backend: FSDP's lr_scheduler_type / min_lr_ratio, Megatron's lr_decay_style /
#: min_lr (engines/verl/rules.py derives min_lr from min_lr_ratio)
SCHEDULE_SHARED = {
    "actor.optim.lr_warmup_steps": "workload.lr_warmup_steps",
    "actor.optim.lr_warmup_steps_ratio": "workload.lr_warmup_steps_ratio",
}
_SCHEDULE = ("the learning rate of every optimizer param group at every step, against the workload's schedule "
             "(parity.harness.contract.schedule)")
SCHEDULE_READ_BACK = {key: ReadBack("schedule", _SCHEDULE) for key in (
    "actor.optim.lr_warmup_steps", "actor.optim.lr_warmup_steps_ratio", "actor.optim.lr_scheduler_type",
    "actor.optim.min_lr_ratio", "actor.optim.lr_decay_style", "actor.optim.min_lr")}
#: what verl's trainer writes into the optimizer config; the harness writes it from workload.steps
TRAINER_SET = Refused(-1, "verl's trainer sets it from the run's length; the harness sets it from workload.steps")

#: verl's optimizer keys that restate a workload field, in both of verl's optimizer configs (the `verl:` block's
#: optim rules are these too: engines/verl/blocks.py)
OPTIM_SHARED = {
    "actor.optim.lr": "workload.lr",
    "actor.optim.weight_decay": "workload.weight_decay",
    "actor.optim.clip_grad": "workload.grad_clip",
    **SCHEDULE_SHARED,
}
#: verl's actor keys of the RL step that restate a workload field (schema.RL_STEP_FIELDS). Which of them an engine
#: implements away from its default is its EngineSpec's `rl_step`; validation refuses the others there, so no
#: refusal here can outlive the feature
RL_STEP_SHARED = {
    "actor.clip_ratio_c": "workload.clip_ratio_c",
    "actor.policy_loss.loss_mode": "workload.policy_loss",
    "actor.ppo_epochs": "workload.ppo_epochs",
    "actor.use_kl_loss": "workload.use_kl_loss",
    "actor.kl_loss_coef": "workload.kl_loss_coef",
    "actor.kl_loss_type": "workload.kl_loss_type",
}
assert {field.removeprefix("workload.") for field in RL_STEP_SHARED.values()} <= set(RL_STEP_FIELDS)

COMMON_SHARED = {
    **OPTIM_SHARED,
    "actor.clip_ratio": "workload.clip_ratio",
    "actor.entropy_coeff": "workload.entropy_coeff",
    "actor.loss_agg_mode": "workload.loss_agg_mode",
    "model.use_remove_padding": "workload.packing",
    **RL_STEP_SHARED,
}
"""The RL step's keys (RL_STEP_SHARED) are written into verl's tree only away from the workload field's default,
which is verl's own default too. `rl_step_keys` reconciles the ones that are no plain restatement: the clip ratios
(verl's clip_ratio_low / high default to 0.2, the workload's to clip_ratio), `ppo_mini_batch_size` (prompts per
mini-batch: batch_size / mini_batches / rollout_n) and `rollout_n` (the workload's group_size)."""

COMMON_READ_BACK = {
    "actor.optim.lr": ReadBack("schedule", _SCHEDULE),
    "actor.optim.weight_decay": ReadBack("optimizer_group", "weight_decay of every optimizer param group"),
    "actor.optim.betas": ReadBack("optimizer_group", "betas of every optimizer param group"),
    "actor.optim.clip_grad": ReadBack("clip_threshold", "max_norm verl passed to its grad clipping, every step"),
    "actor.clip_ratio": ReadBack("policy_loss_call", _POLICY_LOSS),
    "actor.clip_ratio_low": ReadBack("policy_loss_call", _POLICY_LOSS),
    "actor.clip_ratio_high": ReadBack("policy_loss_call", _POLICY_LOSS),
    "actor.clip_ratio_c": ReadBack("policy_loss_call", _POLICY_LOSS),
    "actor.loss_agg_mode": ReadBack("policy_loss_call", _POLICY_LOSS),
    "actor.policy_loss.loss_mode": ReadBack("policy_loss_call", "which function of verl's policy-loss registry "
                                                                "verl's actor loss called"),
    "actor.entropy_coeff": ReadBack("loss_config", _NUMERIC),
    "actor.calculate_entropy": ReadBack("loss_config", _NUMERIC),
    "actor.kl_loss_coef": ReadBack("loss_config", _NUMERIC),
    "actor.rollout_n": ReadBack("loss_config", _NUMERIC),
    "actor.use_kl_loss": ReadBack("kl_loss", "whether verl's actor loss computed a KL term (kl_penalty called)"),
    "actor.kl_loss_type": ReadBack("kl_loss", "the kl type verl's actor loss called kl_penalty with"),
    "actor.ppo_epochs": ReadBack("epochs", "the passes verl's worker made over the step's batch (make_iterator)"),
    "actor.ppo_mini_batch_size": ReadBack("global_batch", "the mini-batches verl's worker formed (make_iterator: "
                                                          "rows of each x dp / rollout_n)"),
    "actor.ppo_micro_batch_size_per_gpu": ReadBack("micro_batches", "rows per micro-batch verl ran (loss count)"),
    "actor.use_dynamic_bsz": ReadBack("micro_batches", "whether verl split micro-batches by tokens"),
    "actor.ppo_max_token_len_per_gpu": ReadBack("micro_batches", "micro-batches verl ran for the token budget"),
    "actor.strategy": ReadBack("backend", "the engine class verl's EngineRegistry built"),
    "model.use_remove_padding": ReadBack("packed_path", "the input shape the model's forward received "
                                                        "(packed (1, T) without mask, or padded (B, S))"),
    "model.enable_gradient_checkpointing": ReadBack("gradient_checkpointing",
                                                    "gradient checkpointing on the built HF model"),
    "model.override_config.*": ReadBack("hf_config", "the attribute on the built model's config"),
}

#: the optimizer keys both of verl's optimizer configs have, taken at one value by every engine (the workload's
#: schedule has no other); the `verl:` block's optim rules read these too
OPTIM_REFUSED = {
    "actor.optim.total_training_steps": TRAINER_SET,
}

COMMON_REFUSED = {
    **OPTIM_REFUSED,
    "actor.shuffle": Refused(False, "the reference takes the mini-batches in order (Workload.mini_batches)"),
    "model.lora_rank": Refused(0, "the reference trains every weight, not a LoRA adapter"),
    "model.use_fused_kernels": Refused(False, "verl's fused kernels need a GPU"),
    "model.use_liger": Refused(False, "liger kernels need a GPU"),
}

FSDP_SCHEDULE = {"actor.optim.lr_scheduler_type": "workload.lr_scheduler_type",
                 "actor.optim.min_lr_ratio": "workload.min_lr_ratio"}

#: FSDPOptimizerConfig's schedule keys, taken at the one value the workload's schedule has
FSDP_OPTIM_REFUSED = {
    "actor.optim.num_cycles": Refused(0.5, "the workload's cosine is a half cycle"),
    "actor.optim.zero_indexed_step": Refused(True, "the workload's schedule counts the first update as step 0, as "
                                                   "verl's default"),
    "actor.optim.warmup_style": Refused(None, "verl's deprecated spelling of lr_scheduler_type: give that"),
}

FSDP = EngineKeys(
    backends=("fsdp", "fsdp2"),
    shared={**COMMON_SHARED, **FSDP_SCHEDULE, "actor.fsdp_config.mixed_precision.param_dtype": "dtype",
            "actor.fsdp_config.ulysses_sequence_parallel_size": "layout.ulysses"},
    quiet_defaults=frozenset({*SCHEDULE_SHARED, *FSDP_SCHEDULE, *RL_STEP_SHARED}),
    read_back={**COMMON_READ_BACK, **SCHEDULE_READ_BACK,
               "actor.fsdp_config.reshard_after_forward": ReadBack(
                   "fsdp_reshard", "reshard-after-forward of every FSDP unit (FSDP1: its sharding strategy)"),
               "actor.fsdp_config.mixed_precision.*": ReadBack(
                   "fsdp_mixed_precision", "the mixed-precision policy of every FSDP unit"),
               # verl's ref worker takes its own fsdp_config (trainer/config/ref/dp_ref.yaml: param_dtype bf16 by
               # default, whatever the actor's): a fp32 row's KL reference is fp32 only where the tree says so
               "ref.fsdp_config.mixed_precision.*": ReadBack(
                   "fsdp_mixed_precision", "the mixed-precision policy of every FSDP unit of verl's ref worker",
                   role="ref"),
               "actor.fsdp_config.model_dtype": ReadBack("master_dtype", "dtype of the sharded master parameters"),
               "actor.fsdp_config.param_offload": ReadBack("resting_place", "where the parameters rest between "
                                                                            "verl's phases"),
               "actor.fsdp_config.optimizer_offload": ReadBack("resting_place", "where the optimizer's state rests "
                                                                                "between verl's phases"),
               "actor.fsdp_config.offload_policy": ReadBack("fsdp_offload_policy",
                                                            "the offload policy of every FSDP2 unit"),
               "actor.fsdp_config.fsdp_size": ReadBack("fsdp_mesh", "the size of the mesh FSDP shards over"),
               "actor.fsdp_config.ulysses_sequence_parallel_size": ReadBack(
                   "ulysses", "the size of verl's Ulysses sequence-parallel group"),
               "actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap": ReadBack(
                   "fsdp_wrapped", "the module classes that are FSDP units"),
               "actor.fsdp_config.forward_prefetch": ReadBack("fsdp_prefetch", "forward prefetch of the FSDP units"),
               "actor.fsdp_config.use_orig_params": ReadBack("fsdp1_orig_params", "FSDP1's use_orig_params"),
               "actor.fsdp_config.use_torch_compile": ReadBack("entropy_compiled",
                                                               "whether verl's entropy function is compiled"),
               "actor.grad_clip": ReadBack("clip_threshold", "max_norm verl passed to its grad clipping",
                                           dropped_in="verl/workers/engine/fsdp/transformer_impl.py optimizer_step "
                                                      "(clips at optim.clip_grad only)")},
    refused={**COMMON_REFUSED, **FSDP_OPTIM_REFUSED,
             "actor.fsdp_config.forward_only": Refused(False, "a forward-only engine cannot train"),
             "actor.fsdp_config.wrap_policy.min_num_params": Refused(
                 0, "the harness reads back class-based wrapping only (transformer_layer_cls_to_wrap)")},
)


def same_value(a: Any, b: Any) -> bool:
    """Equal as verl would take them: numbers by value (1 == 1.0, not True), sequences element-wise (a YAML list
    and verl's tuple), dtype names in any of verl's spellings."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, str) and isinstance(b, str) and a in DTYPE_NAMES and b in DTYPE_NAMES:
        return DTYPE_NAMES[a] == DTYPE_NAMES[b]
    return a == b


# ---- verl's Megatron engine (McoreActorConfig: actor.megatron is its McoreEngineConfig) --------------------------
#: McoreEngineConfig names Megatron's own sizes (the megatron spec's layout-owned keys); the expert TP size follows
#: the layout's own rule (rules.prepare_megatron)
_MEGATRON_SIZES = {key: field for key, field in MEGATRON_LAYOUT_KEYS.items()
                   if field not in ("layout.etp", "layout.sequence_parallel")}
#: verl's engine sets the model's sequence parallelism itself on the vanilla-mbridge path (mbridge: tp > 1), and
#: forwards McoreEngineConfig.sequence_parallel only on the Megatron-Bridge path
SEQUENCE_PARALLEL_DROP = ("verl/workers/engine/megatron/transformer_impl.py:328-333 (vanilla mbridge: only "
                          "override_transformer_config reaches the TransformerConfig, :361 forwards it on the "
                          "Megatron-Bridge path only; mbridge/core/llm_bridge.py:76 sets sequence_parallel = tp > 1)")
#: verl builds Megatron's OptimizerConfig from a fixed set of its optimizer keys; betas is not one of them
BETAS_DROP = ("verl/utils/megatron/optimizer.py:126-217 init_megatron_optim_config (betas never reach Megatron's "
              "OptimizerConfig: adam_beta1 / adam_beta2 keep Megatron's defaults unless "
              "override_optimizer_config sets them)")

MEGATRON_SCHEDULE = {"actor.optim.lr_decay_style": "workload.lr_scheduler_type"}

#: McoreOptimizerConfig's schedule keys, taken at the one value the workload's schedule has
MEGATRON_OPTIM_REFUSED = {
    "actor.optim.lr_warmup_init": Refused(0.0, "the workload's warmup starts from 0"),
    "actor.optim.lr_decay_steps": Refused(None, "the workload's decay runs over its steps (verl's None: "
                                                "total_training_steps)"),
    "actor.optim.weight_decay_incr_style": Refused("constant", "the workload's weight decay is constant"),
    "actor.optim.lr_wsd_decay_steps": Refused(None, "the workload's schedule has no WSD phase"),
}

MEGATRON = EngineKeys(
    backends=("megatron",),
    quiet_defaults=frozenset({*SCHEDULE_SHARED, *MEGATRON_SCHEDULE, *RL_STEP_SHARED}),
    shared={**COMMON_SHARED, **MEGATRON_SCHEDULE, "actor.megatron.dtype": "dtype",
            "actor.megatron.sequence_parallel": "layout.sequence_parallel",
            **{f"actor.megatron.{key}": field for key, field in _MEGATRON_SIZES.items()}},
    read_back={**{k: v for k, v in COMMON_READ_BACK.items()
                  if not k.startswith(("model.override_config", "model.enable_gradient_checkpointing"))},
               "actor.optim.clip_grad": ReadBack("mcore_clip", "clip_grad of Megatron's OptimizerConfig and the "
                                                               "max_norm its grad clipping ran with, every step"),
               "actor.optim.weight_decay": ReadBack("mcore_weight_decay",
                                                    "weight_decay of Megatron's OptimizerConfig and of every "
                                                    "param group that decays"),
               "actor.optim.betas": ReadBack("optimizer_group", "betas of every optimizer param group",
                                             dropped_in=BETAS_DROP),
               "actor.optim.optimizer": ReadBack("mcore_optimizer", "optimizer of Megatron's OptimizerConfig"),
               **SCHEDULE_READ_BACK,
               "actor.optim.override_optimizer_config.*": ReadBack("mcore_optimizer",
                                                                   "the field of Megatron's OptimizerConfig"),
               **{f"actor.megatron.{key}": ReadBack("mcore_parallel", f"{key.removesuffix('_size')} group size "
                                                                      "in megatron.core.parallel_state")
                  for key in (*_MEGATRON_SIZES, "expert_tensor_parallel_size")},
               "actor.megatron.sequence_parallel": ReadBack("mcore_sequence_parallel",
                                                            "sequence_parallel of every model chunk's "
                                                            "TransformerConfig", dropped_in=SEQUENCE_PARALLEL_DROP),
               "actor.megatron.dtype": ReadBack("mcore_dtype", "dtype of every model parameter and the "
                                                               "TransformerConfig's params_dtype"),
               "actor.megatron.use_distributed_optimizer": ReadBack(
                   "mcore_distributed_optimizer", "the optimizer class verl built and the DDP config of every chunk"),
               "actor.megatron.override_transformer_config.*": ReadBack(
                   "mcore_transformer", "the field of every model chunk's TransformerConfig"),
               "actor.megatron.override_ddp_config.*": ReadBack("mcore_ddp",
                                                                "the field of every chunk's DDP config"),
               "actor.megatron.vanilla_mbridge": ReadBack("mcore_bridge", "the bridge module verl built with"),
               "actor.optim.use_checkpoint_opt_param_scheduler": ReadBack(
                   "mcore_scheduler_checkpoint", "the flag on Megatron's OptimizerParamScheduler and on verl's "
                                                 "checkpoint manager (which loads the scheduler's state only with "
                                                 "it)"),
               "actor.megatron.use_remove_padding": ReadBack(
                   "packed_path", "the input shape the model's forward received",
                   dropped_in="verl/workers/engine_workers.py (the worker sets it from model.use_remove_padding)"),
               "model.enable_gradient_checkpointing": ReadBack(
                   "mcore_recompute", "activation recompute of the built TransformerConfig (recompute_granularity)",
                   dropped_in="verl/workers/engine/megatron/transformer_impl.py (never read: Megatron recompute "
                              "comes from override_transformer_config.recompute_*)")},
    refused={**COMMON_REFUSED,
             "actor.megatron.forward_only": Refused(False, "a forward-only engine cannot train"),
             "actor.megatron.use_mbridge": Refused(True, "verl's Megatron engine requires it (asserted in its "
                                                         "constructor)"),
             "actor.megatron.param_offload": Refused(False, "on a CPU-only box offloading to the CPU moves nothing, "
                                                            "so nothing could show whether verl applied it"),
             "actor.megatron.optimizer_offload": Refused(False, "on a CPU-only box offloading to the CPU moves "
                                                                "nothing, so nothing could show whether verl applied "
                                                                "it"),
             "actor.megatron.use_dist_checkpointing": Refused(False, "the engine loads the scenario's HF checkpoint"),
             "actor.megatron.dynamic_context_parallel": Refused(False, "not read back here (needs packed batches "
                                                                       "and Megatron's dynamic CP groups)"),
             **MEGATRON_OPTIM_REFUSED,
             "actor.optim.use_precision_aware_optimizer": Refused(False, "needs Transformer Engine's FusedAdam")},
    verl_none={"actor.megatron.virtual_pipeline_model_parallel_size": 1},
)
