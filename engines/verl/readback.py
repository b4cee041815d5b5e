"""The read-backs the verl key table names (engines/verl/keys.py): each reads what verl built or did, from the
engine's own objects or from what was observed while it ran (engines/verl/observe.py), never from the scenario.
A rule returns the requested value when verl's effective value agrees with it (in any of verl's spellings), and
the effective value otherwise, so that the judge's kwargs check names both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from parity.engines.verl.keys import BLOCK, DTYPE_NAMES, same_value

OBSERVES: dict[str, str] = {
    # readback.py
    "optimizer_group": "every param group of the optimizer verl built, at each optimizer.step()",
    "schedule": "the lr every param group ran at, at each optimizer.step()",
    "clip_threshold": "the max_norm torch's grad clipping was called with",
    "loss_config": "the actor config verl's ppo_loss was called with",
    "policy_loss_call": "the arguments of the policy-loss function verl's registry returned",
    "kl_loss": "whether and how verl's actor loss called kl_penalty",
    "global_batch": "the mini-batches verl's worker formed (make_iterator)",
    "epochs": "the passes verl's worker made over its batch (make_iterator)",
    "micro_batches": "the micro-batches verl's prepare_micro_batches made",
    "backend": "the engine class verl's EngineRegistry built",
    "packed_path": "the input every forward of the built model received",
    "gradient_checkpointing": "the built HF model",
    "hf_config": "the built HF model's config",
    # fsdp.py
    "fsdp_reshard": "every FSDP unit verl built", "fsdp_mixed_precision": "every FSDP unit verl built",
    "master_dtype": "the sharded parameters", "resting_place": "where parameters / optimizer state rest between "
                                                               "phases",
    "fsdp_offload_policy": "every FSDP2 unit", "fsdp_mesh": "the mesh the units shard over",
    "ulysses": "verl's Ulysses device mesh", "fsdp_wrapped": "the modules that are FSDP units",
    "fsdp_prefetch": "the FSDP units' prefetch", "fsdp1_orig_params": "the FSDP1 module",
    "entropy_compiled": "verl's entropy function object",
    # megatron.py
    "mcore_transformer": "every model chunk's TransformerConfig", "mcore_ddp": "every chunk's DDP config",
    "mcore_optimizer": "Megatron's OptimizerConfig verl built", "mcore_clip": "the OptimizerConfig and the max_norm "
                                                                              "Megatron clipped with",
    "mcore_weight_decay": "the OptimizerConfig and every decaying param group",
    "mcore_parallel": "megatron.core.parallel_state's groups", "mcore_sequence_parallel": "every chunk's "
                                                                                         "TransformerConfig",
    "mcore_dtype": "every parameter and the TransformerConfig", "mcore_distributed_optimizer": "the optimizer class "
                                                                                              "and DDP configs",
    "mcore_bridge": "the bridge module verl built with", "mcore_scheduler_checkpoint": "Megatron's scheduler and "
                                                                                      "verl's checkpoint manager",
    "mcore_recompute": "every chunk's TransformerConfig",
}
"""Every read-back rule and the object verl built or the call verl made that it reads: a rule reads what verl did,
never the scenario or a value the harness set (tests/unit/test_verl_readback_observes.py fails on a rule missing
here and on one that answers the request whatever verl did)."""

NOT_READ = object()
"""A key with no read-back that is not at verl's default: reported as not applied."""

Rule = Callable[[Any, str, Any], Any]
RULES: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn
    return register


def read_back(engine: Any, key: str, requested: Any) -> Any:
    """What verl did with one key (see the module docstring)."""
    spec = engine.keys.read_back_for(key)
    if spec is not None:
        worker = engine.role_view(spec.role)
        if isinstance(worker, str):
            return worker
        effective = RULES[spec.rule](worker, key, requested)
        if spec.dropped_in and not same_value(effective, requested):
            return f"{effective!r}: verl does not apply it ({spec.dropped_in})"
        return effective
    if key in engine.configs.defaults and same_value(requested, engine.configs.defaults[key]):
        return _config_value(engine, key)
    return NOT_READ


def agreeing(requested: Any, effective: Any) -> Any:
    return requested if same_value(requested, effective) else effective


def built_at(kind: str) -> Callable[[Rule], Rule]:
    """A rule whose disagreeing value names where verl built the object it reads (observe.BUILD_SITES)."""
    def wrap(fn: Rule) -> Rule:
        def located(engine: Any, key: str, requested: Any) -> Any:
            from parity.engines.verl.observe import BUILD_SITES

            effective = fn(engine, key, requested)
            if same_value(effective, requested) or kind not in BUILD_SITES:
                return effective
            return f"{effective!r}, as built at {BUILD_SITES[kind]}"
        located.__name__ = fn.__name__
        return located
    return wrap


def unanimous(values: Iterable[Any], what: str) -> Any:
    """The one value every unit / step shows; a mix is reported as such (it agrees with no request)."""
    values = list(values)
    seen = list(dict.fromkeys(repr(v) for v in values))
    if not seen:
        return f"no {what} observed"
    if len(seen) > 1:
        return f"mixed {what}: {', '.join(seen)}"
    return values[0]


def _config_value(engine: Any, key: str) -> Any:
    """The value verl's built config dataclass holds for a key (for keys at verl's default only)."""
    section, _, rest = key.partition(".")
    node: Any = engine.configs.actor if section == "actor" else engine.configs.model
    for part in rest.split("."):
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return node


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype) if dtype else None


def _dtype_agreeing(requested: Any, dtype: torch.dtype | None) -> Any:
    effective = _dtype_name(dtype)
    return requested if DTYPE_NAMES.get(str(requested)) == effective else effective


# ---- rules every verl engine has ----------------------------------------------------------------------------
@rule("optimizer_group")
@built_at("optimizer")
def optimizer_group(engine: Any, key: str, requested: Any) -> Any:
    name = key.rsplit(".", 1)[-1]
    values = [tuple(g[name]) if isinstance(g[name], (list, tuple)) else g[name]
              for step in engine.observed.optimizer_groups for g in step]
    effective = unanimous(values, f"optimizer {name}")
    return agreeing(tuple(requested) if isinstance(requested, list) else requested, effective) \
        if not isinstance(effective, str) else effective


@rule("schedule")
def schedule(engine: Any, key: str, requested: Any) -> Any:
    """The lr and the schedule keys restate the workload's schedule (lr its peak): what verl did with them is the
    learning rate every param group of its optimizer ran at, at every optimizer update, against that schedule: every
    update of a training step at the step's lr (the judge also checks each step)."""
    from parity.harness.contract.schedule import describe, lr_at

    workload = engine.ctx.scenario.workload
    steps = engine.observed.optimizer_groups
    if not steps:
        return "no optimizer step observed"
    per_step = workload.updates_per_step
    for index, groups in enumerate(steps):
        number, update = index // per_step + 1, index % per_step + 1
        expected = lr_at(workload, number)
        for group in groups:
            if abs(group["lr"] - expected) > 1e-6 * workload.lr:
                return (f"lr {group['lr']:.6g} at step {number} update {update}, the schedule's {expected:.6g} "
                        f"({describe(workload)}; the scheduler steps once per training step)")
    return requested


@rule("clip_threshold")
def clip_threshold(engine: Any, key: str, requested: Any) -> Any:
    return agreeing(requested, unanimous(engine.observed.clip_max_norms, "clip thresholds"))


@rule("loss_config")
def loss_config(engine: Any, key: str, requested: Any) -> Any:
    """The value in the actor config verl's loss function (ppo_loss) was called with, every call (observe.py; its
    effect on the loss is judged numerically against the reference)."""
    name = key.rsplit(".", 1)[-1]
    called = engine.observed.loss_configs
    if not called:
        return "verl's actor loss was never called"
    return agreeing(requested, unanimous([getattr(config, name) for config in called], name))


@rule("policy_loss_call")
def policy_loss_call(engine: Any, key: str, requested: Any) -> Any:
    """The argument the policy-loss function verl's registry returned was called with, every call: the clip ratios
    in the config it got, the aggregation it was asked for, and which registered function it was."""
    calls = engine.observed.policy_losses
    if not calls:
        return "verl's policy loss was never called"
    name = key.rsplit(".", 1)[-1]
    return agreeing(requested, unanimous([getattr(call, name) for call in calls], name))


@rule("kl_loss")
def kl_loss(engine: Any, key: str, requested: Any) -> Any:
    """Whether verl's actor loss computed a KL term (kl_penalty called), and with which kl type."""
    types = engine.observed.kl_types
    if key.endswith("use_kl_loss"):
        return agreeing(requested, bool(types))
    if not types:
        return "verl's actor loss computed no KL term"
    return agreeing(requested, unanimous(types, "kl types"))


def _mini_batches(engine: Any) -> list[Any]:
    return engine.observed.mini_batches


@rule("global_batch")
def global_batch(engine: Any, key: str, requested: Any) -> Any:
    """ppo_mini_batch_size (prompts) from the mini-batches verl's worker formed (train_mini_batch's make_iterator):
    the rows of every mini-batch it yielded on this rank, times data parallel, over rollout.n responses each."""
    formed = _mini_batches(engine)
    if not formed:
        return "no mini-batches observed"
    rows = unanimous([r for f in formed for r in f.rows], "mini-batch sizes")
    if isinstance(rows, str):
        return rows
    n = int(engine.tree[BLOCK].rollout.n)
    sequences = rows * engine.engine.get_data_parallel_size()
    return agreeing(requested, sequences / n if sequences % n else sequences // n)


@rule("epochs")
def epochs(engine: Any, key: str, requested: Any) -> Any:
    """ppo_epochs from the passes verl's worker made over its batch: the rows make_iterator yielded per
    update_actor over the rows it was given."""
    formed = _mini_batches(engine)
    if not formed:
        return "no mini-batches observed"
    passes = [sum(f.rows) / f.batch_rows for f in formed]
    return agreeing(requested, unanimous([int(p) if p == int(p) else p for p in passes], "passes over the batch"))


@rule("micro_batches")
def micro_batches(engine: Any, key: str, requested: Any) -> Any:
    """From the micro-batches verl's prepare_micro_batches made for each train_batch."""
    made = engine.observed.batching("train")
    if not made:
        return "no micro-batching observed"
    if key.endswith("use_dynamic_bsz"):
        return agreeing(requested, unanimous([m.by_tokens for m in made], "micro-batching modes"))
    if key.endswith("ppo_micro_batch_size_per_gpu"):
        if any(m.by_tokens for m in made):
            return None if requested is None else "verl split the micro-batches by tokens"
        return agreeing(requested, unanimous([r for m in made for r in m.rows], "micro-batch sizes"))
    # ppo_max_token_len_per_gpu: verl balances by tokens; no micro-batch may exceed the budget (x ulysses size)
    if not all(m.by_tokens for m in made):
        return "verl split the micro-batches by rows"
    budget = float(requested) * engine.sequence_parallel_size()
    largest, rows = max((t, r) for m in made for t, r in zip(m.tokens, m.rows, strict=True))
    if largest <= budget:
        return requested
    # several sequences over the budget could have been split: verl's balanced partition (ceil(tokens / budget)
    # micro-batches is a lower bound) kept them together; one sequence over it cannot be split
    # (no apostrophe: the judge quotes the value with repr)
    split = ("; verl did not split them (its balanced partition: verl/utils/seqlen_balancing.py "
             "rearrange_micro_batches)") if rows > 1 else ""
    return f"a micro-batch of {largest} tokens in {rows} sequence{'s' if rows > 1 else ''} (budget {budget:g}){split}"


@rule("backend")
def backend(engine: Any, key: str, requested: Any) -> Any:
    return agreeing(requested, engine.built_backend())


@rule("packed_path")
def packed_path(engine: Any, key: str, requested: Any) -> Any:
    """True when every forward got one packed row without a mask, False when every forward got padded rows."""
    shapes = engine.observed.forward_inputs
    if not shapes:
        return "no forward observed"
    packed = {shape[0] == 1 and not masked for shape, masked in shapes}
    return agreeing(requested, packed.pop()) if len(packed) == 1 else "mixed packed and padded forwards"


@rule("gradient_checkpointing")
def gradient_checkpointing(engine: Any, key: str, requested: Any) -> Any:
    return agreeing(requested, bool(getattr(engine.hf_model(), "is_gradient_checkpointing", False)))


@rule("hf_config")
def hf_config(engine: Any, key: str, requested: Any) -> Any:
    name = key.split("override_config.", 1)[1]
    config = engine.hf_model().config
    attribute = "_attn_implementation" if name == "attn_implementation" else name
    for part in attribute.split("."):
        config = getattr(config, part, None) if not isinstance(config, dict) else config.get(part)
    return agreeing(requested, config)
