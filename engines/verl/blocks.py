"""verl's engine blocks, key by key, for the harness's OWN engines (a scenario's `verl:` block; the front door is
engines/verl/vocabulary.py).

verl's trainer config holds an engine's settings in three blocks under `actor_rollout_ref.actor`: `megatron`
(McoreEngineConfig), `fsdp_config` (FSDPEngineConfig) and `optim` (McoreOptimizerConfig / FSDPOptimizerConfig);
`trainer.n_gpus_per_node` / `nnodes` / `device` give the world. Every key of those blocks as verl generates them
(verl/trainer/config/_generated_ppo_megatron_trainer.yaml and _generated_ppo_trainer.yaml) has one rule here:

- `To`: translated into a scenario field (layout, mcore_kwargs / fsdp_kwargs, workload, dtype), where the
  engine's read-back checks that it landed;
- `Merge`: a dict-typed verl field whose keys go into the engine's kwargs block (override_transformer_config,
  override_ddp_config, override_optimizer_config -> mcore_kwargs), each routed and read back by the engine;
- `Only`: every engine runs exactly these values; another value is refused with the reason. What an engine
  supports (packings, schedules, losses, RL-step settings) is never an `Only`: such a key is a `To` into the
  workload field, and validation refuses it from the engine's EngineSpec (tests/unit/test_verl_blocks.py fails a
  refusal that an EngineSpec contradicts);
- `Inert`: taken at any value because it cannot change what the harness compares (checkpoint paths, verl's own
  host offload between its phases, profiler, ...), each with the reason.

A key absent from the block takes verl's default where verl's default differs from the harness's (VERL_DEFAULTS):
a verl user's override list relies on them. Values are compared as verl takes them (keys.same_value). The keys
that restate a workload field, and the schedule values every engine is held to, are engines/verl/keys.py's, which
verl's own engines read too: each is stated once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from parity.engines.specs import SPECS
from parity.engines.verl.keys import (
    DTYPE_NAMES,
    FSDP_OPTIM_REFUSED,
    FSDP_SCHEDULE,
    MEGATRON_OPTIM_REFUSED,
    MEGATRON_SCHEDULE,
    OPTIM_REFUSED,
    OPTIM_SHARED,
    PACKING,
    VERL_DTYPE,
    Refused,
)
from parity.harness.contract.spec import EngineSpec, VerlNames

ACTOR = "actor_rollout_ref.actor."
TRAINER = "trainer."

VERL_ENGINES: dict[str, VerlNames] = {spec.name: spec.verl for spec in SPECS.values() if spec.verl is not None}
"""The harness engines a `verl:` block can name -> how verl names them (EngineSpec.verl)."""


def _implied(config: str) -> EngineSpec:
    """The engine whose settings come from verl's `config` class when nothing else says which."""
    return next(SPECS[name] for name, verl in VERL_ENGINES.items() if verl.config == config and verl.implied)


@dataclass(frozen=True, slots=True)
class To:
    """Translated into one scenario field ('layout.tp', 'mcore_kwargs.use_distributed_optimizer', 'workload.lr',
    'dtype', 'strategy', 'fsdp_size', 'nnodes', 'n_gpus_per_node', 'device')."""

    field: str
    convert: Callable[[Any], Any] | None = None


@dataclass(frozen=True, slots=True)
class Merge:
    """A dict-typed verl field merged key by key into an engine kwargs block."""

    block: str


@dataclass(frozen=True, slots=True)
class Only:
    """Taken at these values only (what the harness's engines do); any other value is refused."""

    values: tuple[Any, ...]
    why: str


@dataclass(frozen=True, slots=True)
class Inert:
    """Taken at any value: it cannot change what the harness compares."""

    why: str


Rule = To | Merge | Only | Inert


class RefusedKey(ValueError):
    """A verl key (`key`, as the user wrote it) the harness cannot take at its value, or a `verl:` block it cannot
    read; harness/config turns it into a ScenarioError naming the file and scenario."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def _precision(value: Any) -> str:
    if str(value) not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {value!r} (verl's spellings: {', '.join(DTYPE_NAMES)})")
    return DTYPE_NAMES[str(value)]


def _torch_precision(value: Any) -> str:
    """verl hands its optimizer dtype fields to Megatron through PrecisionType.to_dtype
    (verl/utils/megatron/optimizer.py): 'fp32' is torch.float32 (Megatron's dtype fields take torch.dtype names)."""
    return VERL_DTYPE[_precision(value)]


def _packing(value: Any) -> str:
    """verl's use_remove_padding: packed rows (verl's THD path) or padded ones; the engine's spec says which it
    feeds (EngineSpec.packings)."""
    return PACKING[_flag(value)]


def _layout_degree(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{value!r} is not a parallel degree (an integer >= 1)")
    return value


def _optional_degree(value: Any) -> int | None:
    return None if value is None else _layout_degree(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false")
    return value


def _adam(value: Any) -> str:
    """verl's Megatron optimizer 'adam' is Megatron's Adam with decoupled weight decay (AdamW); its FSDP one is
    torch's class name."""
    names = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd"}
    if str(value).lower() not in names:
        raise ValueError(f"optimizer {value!r}: the harness's engines and reference run AdamW or SGD")
    return names[str(value).lower()]


_OFFLOAD = ("verl's engine moves these tensors to host memory between its phases (verl/utils/megatron_utils.py, "
            "verl/utils/fsdp_utils.py offload_*); that changes memory, not numbers, and does not reach the "
            "harness's engines, which keep them on the device")
_CHECKPOINT = "checkpoint saving / loading: the harness saves no checkpoint and loads the HF weights itself"
_LOADER = ("how verl loads HF weights into Megatron; the harness converts them itself (engines/megatron/convert.py) "
           "and the step-0 log-probs check the load")
_PADDING = "how verl pads its batches; padded positions are masked and carry no loss, and the harness pads its own"
_ENTROPY = ("verl's engine computes the same entropy in chunks / compiled / checkpointed to save memory or time; "
            "the harness's engines compute it whole")
_WSD_ONLY = "read only by lr_decay_style wsd, which the workload's schedule does not have (its lr_scheduler_type)"
_QAT_ONLY = "read only with qat.enable"
_MUON_ONLY = "read only by verl's Muon optimizer (optimizer: muon)"
_TURBO_ONLY = "read only by verl's fsdp_turbo strategy (Ascend FSDPTurbo), which no harness engine implements"
_REPLAY_ONLY = "read only with router_replay.mode other than disabled"

#: McoreEngineConfig's sizes that verl leaves Optional (null: no VPP; Megatron's etp = tp)
_OPTIONAL_SIZES = ("virtual_pipeline_model_parallel_size", "expert_tensor_parallel_size")

MEGATRON: dict[str, Rule] = {
    # McoreEngineConfig names Megatron's own sizes: the megatron spec's layout-owned keys (engines/megatron/spec.py)
    **{name: To(where, _flag if where == "layout.sequence_parallel"
                else _optional_degree if name in _OPTIONAL_SIZES else _layout_degree)
       for name, where in _implied("McoreEngineConfig").layout_keys.items()},
    "use_distributed_optimizer": To("mcore_kwargs.use_distributed_optimizer", _flag),
    "override_transformer_config": Merge("mcore_kwargs"),
    "override_ddp_config": Merge("mcore_kwargs"),
    "dtype": To("dtype", _precision),
    "seed": To("workload.seed"),
    "param_offload": Inert(_OFFLOAD),
    "grad_offload": Inert(_OFFLOAD),
    "optimizer_offload": Inert(_OFFLOAD),
    "use_dist_checkpointing": Inert(_CHECKPOINT),
    "dist_checkpointing_path": Inert(_CHECKPOINT),
    "dist_checkpointing_prefix": Inert(_CHECKPOINT),
    "dist_ckpt_optim_fully_reshardable": Inert(_CHECKPOINT),
    "distrib_optim_fully_reshardable_mem_efficient": Inert(_CHECKPOINT),
    "use_mbridge": Inert(_LOADER),
    "vanilla_mbridge": Inert(_LOADER),
    "pad_bshd_to_minibatch_max": Inert(_PADDING),
    "pad_to_length": Inert(_PADDING),
    "pad_to_length_bucket": Inert(_PADDING),
    "entropy_from_logits_with_chunking": Inert(_ENTROPY),
    "entropy_from_logits_chunk_size": Inert(_ENTROPY),
    "use_remove_padding": To("workload.packing", _packing),
    "dynamic_context_parallel": Only((False,), "verl re-plans context parallelism per batch; the harness runs the "
                                               "layout's fixed cp"),
    "max_seqlen_per_dp_cp_rank": Only((None,), "read only by dynamic_context_parallel"),
    "override_mcore_model_config": Only(({},), "GPTModel constructor overrides: the harness builds GPTModel from "
                                               "the checkpoint's config and takes none"),
    "use_megatron_fsdp": Only((False,), "Megatron-FSDP is another engine; the harness's runs Megatron DDP"),
    "forward_only": Only((False,), "a forward-only engine cannot train"),
    "router_replay.mode": Only(("disabled",), "router replay reuses the rollout's routing; the harness has no "
                                              "rollout"),
    "router_replay.record_file": Inert(_REPLAY_ONLY),
    "router_replay.replay_file": Inert(_REPLAY_ONLY),
    "qat.enable": Only((False,), "quantization-aware training changes the forward; the reference is unquantised"),
    **{f"qat.{key}": Inert(_QAT_ONLY) for key in ("mode", "group_size", "ignore_patterns", "activation_observer",
                                                  "quantization_config_path")},
}

FSDP_CONFIG: dict[str, Rule] = {
    "fsdp_size": To("fsdp_size"),
    "ulysses_sequence_parallel_size": To("layout.ulysses", _layout_degree),
    "reshard_after_forward": To("fsdp_kwargs.reshard_after_forward", _flag),
    "mixed_precision.param_dtype": To("fsdp_kwargs.param_dtype", _precision),
    "mixed_precision.reduce_dtype": To("fsdp_kwargs.reduce_dtype", _precision),
    "mixed_precision.buffer_dtype": Only(("fp32", "float32", "32"), "the harness keeps buffers (RoPE inverse "
                                                                      "frequencies) in fp32"),
    "dtype": To("dtype", _precision),
    "strategy": To("strategy"),
    "seed": To("workload.seed"),
    "model_dtype": Only(("fp32", "float32", "32"), "the harness's FSDP engine keeps fp32 master shards (verl's "
                                                   "default) and computes in the mixed-precision param dtype"),
    "wrap_policy.min_num_params": Only((0,), "the harness wraps every decoder layer (verl's default, "
                                             "min_num_params 0)"),
    "wrap_policy.transformer_layer_cls_to_wrap": Only((None,), "the harness wraps the model's decoder-layer class "
                                                               "(verl's default)"),
    "offload_policy": Only((False,), "FSDP2's CPUOffloadPolicy runs the optimizer step on the host; the harness's "
                                     "FSDP engine keeps it on the device"),
    "forward_only": Only((False,), "a forward-only engine cannot train"),
    "param_offload": Inert(_OFFLOAD),
    "optimizer_offload": Inert(_OFFLOAD),
    "forward_prefetch": Inert("prefetching reorders FSDP1's all-gathers, not arithmetic"),
    "use_orig_params": Inert("an FSDP1 wrapping detail; the harness's FSDP engine is FSDP2"),
    # verl 0.9.1 (gone from verl main)
    "use_no_sync_for_gradient_accumulation": Inert("defers FSDP's gradient reduce-scatter to the last micro-batch: "
                                                   "the same sum, reduced once"),
    "full_determinism": Inert("the harness sets deterministic algorithms itself (harness/config/devices.py)"),
    "entropy_from_logits_with_chunking": Inert(_ENTROPY),
    "entropy_from_logits_chunk_size": Inert(_ENTROPY),
    "entropy_checkpointing": Inert(_ENTROPY),
    "use_torch_compile": Inert(_ENTROPY),
    "pad_to_length": Inert(_PADDING),
    "pad_to_length_bucket": Inert(_PADDING),
    "qat.enable": MEGATRON["qat.enable"],
    **{f"qat.{key}": Inert(_QAT_ONLY) for key in ("mode", "group_size", "ignore_patterns", "activation_observer",
                                                  "quantization_config_path")},
    "turbo_config.*": Inert(_TURBO_ONLY),
}

OPTIM_PREFIX = "actor.optim."


def _only(refused: dict[str, Refused]) -> dict[str, Rule]:
    """The optimizer keys verl's own engines are held to one value (engines/verl/keys.py): the same value here."""
    return {key.removeprefix(OPTIM_PREFIX): Only((rule.allowed,), rule.why) for key, rule in refused.items()}


OPTIM: dict[str, Rule] = {
    # the schedule's values are the workload's own (verl's Megatron lr_decay_style and its FSDP lr_scheduler_type
    # name the same curves: harness/contract/schedule.py); the workload's schema refuses another
    **{key.removeprefix(OPTIM_PREFIX): To(field)
       for key, field in {**OPTIM_SHARED, **FSDP_SCHEDULE, **MEGATRON_SCHEDULE}.items()},
    **_only({**OPTIM_REFUSED, **FSDP_OPTIM_REFUSED, **MEGATRON_OPTIM_REFUSED}),
    "optimizer": To("workload.optimizer", _adam),
    "betas": Only(((0.9, 0.999),), "the harness's optimizers and its reference use AdamW betas (0.9, 0.999)"),
    "optimizer_impl": Only(("torch.optim",), "the harness builds torch.optim.AdamW"),
    "min_lr": Only((0, 0.0), "Megatron's absolute floor of the decay: give it as min_lr_ratio (the workload's floor "
                             "is a fraction of lr)"),
    "lr_wsd_decay_style": Inert(_WSD_ONLY),
    "use_layer_wise_distributed_optimizer": Only((False,), "the harness runs Megatron's distributed optimizer as "
                                                           "is (use_distributed_optimizer)"),
    "use_precision_aware_optimizer": To("mcore_kwargs.use_precision_aware_optimizer", _flag),
    "main_grads_dtype": To("mcore_kwargs.main_grads_dtype", _torch_precision),
    "exp_avg_dtype": To("mcore_kwargs.exp_avg_dtype", _torch_precision),
    "exp_avg_sq_dtype": To("mcore_kwargs.exp_avg_sq_dtype", _torch_precision),
    "override_optimizer_config": Merge("mcore_kwargs"),
    "use_checkpoint_opt_param_scheduler": Inert(_CHECKPOINT),
    **{key: Inert(_MUON_ONLY) for key in ("muon_momentum", "muon_nesterov", "muon_split_qkv", "muon_scale_mode",
                                          "muon_coefficient_type", "muon_num_ns_steps", "muon_tp_mode",
                                          "muon_fp32_matmul_prec", "muon_extra_scale_factor", "muon_scalar_optimizer",
                                          "muon_match_adamw_update_rms")},
}

TRAINER_KEYS: dict[str, Rule] = {
    "n_gpus_per_node": To("n_gpus_per_node", _layout_degree),
    "nnodes": To("nnodes", _layout_degree),
    "device": To("device"),
}

#: verl's engine config class -> the rules of its block
RULES: dict[str, dict[str, Rule]] = {"McoreEngineConfig": MEGATRON, "FSDPEngineConfig": FSDP_CONFIG}
#: actor_rollout_ref.actor.<block> -> the block's rules; `strategy` is the actor's own key
BLOCKS: dict[str, dict[str, Rule]] = {**{verl.block: RULES[verl.config] for verl in VERL_ENGINES.values()},
                                      "optim": OPTIM}
#: which engine family reads each engine block, and the reverse
BLOCK_FAMILY = {verl.block: verl.family for verl in VERL_ENGINES.values()}
FAMILY_BLOCK = {family: block for block, family in BLOCK_FAMILY.items()}
#: the harness engine each family's block means when the `verl:` block names no strategy, and the one verl's
#: default strategy means when it carries no engine block either
IMPLIED = {verl.family: name for name, verl in VERL_ENGINES.items() if verl.implied}
DEFAULT_STRATEGY = next(name for name, verl in VERL_ENGINES.items() if verl.default)
#: which family's engines read each harness kwargs block
KWARGS_FAMILY = {block: verl.family for name, verl in VERL_ENGINES.items() for block in SPECS[name].kwargs_blocks}
#: the harness kwargs blocks a `verl:` block writes (the engines verl names read them)
ENGINE_KWARGS = tuple(KWARGS_FAMILY)

#: verl's defaults where they differ from the harness's, per config class (verl/workers/config/engine.py
#: EngineConfig, McoreEngineConfig: dtype bfloat16, sequence_parallel True, use_distributed_optimizer True,
#: expert_tensor_parallel_size None = tp, Megatron's rule in parallel_state.initialize_model_parallel)
VERL_DEFAULTS = {"McoreEngineConfig": {"sequence_parallel": True, "use_distributed_optimizer": True,
                                       "expert_tensor_parallel_size": None, "dtype": "bfloat16"},
                 "FSDPEngineConfig": {"dtype": "bfloat16"}}
#: the same per family, with the rules they go through
FAMILY_DEFAULTS = {verl.family: (VERL_DEFAULTS[verl.config], RULES[verl.config]) for verl in VERL_ENGINES.values()}

#: the flat (engine-config) form: these keys are the harness's own, not a block's
FLAT_EXTRAS = {"strategy": ACTOR + "strategy", "device": TRAINER + "device",
               "n_gpus_per_node": TRAINER + "n_gpus_per_node", "nnodes": TRAINER + "nnodes"}

_OC_SELECT = re.compile(r"^\$\{oc\.select:([^,}]+)(?:,(.*))?\}$")
_INTERPOLATION = re.compile(r"\$\{")


def rule_for(block: dict[str, Rule], key: str) -> tuple[str, Rule] | None:
    """(pattern, rule) of a key within a block: exact, a Merge field's sub-key, or a 'prefix.*' pattern."""
    if key in block:
        return key, block[key]
    for pattern, rule in block.items():
        if isinstance(rule, Merge) and key.startswith(pattern + "."):
            return pattern, rule
        if pattern.endswith(".*") and key.startswith(pattern[:-1]):
            return pattern, rule
    return None


def resolve_interpolation(value: Any, tree: dict[str, Any]) -> tuple[Any, bool]:
    """verl's generated configs hold OmegaConf `${oc.select:path,default}` references: resolved against the
    block's own keys, else the default. (value, True) when resolved or not an interpolation; (value, False)
    for any other interpolation (left to the caller to refuse where the value matters)."""
    if not isinstance(value, str) or not _INTERPOLATION.search(value):
        return value, True
    found = _OC_SELECT.match(value.strip())
    if found is None:
        return value, False
    path, default = found.group(1).strip(), found.group(2)
    if path in tree:
        return tree[path], True
    return (None if default is None else yaml.safe_load(default)), True
