"""Validation of a verl scenario before anything runs (EngineSpec.rules / prepare): every key given must exist in
verl's config and pass verl's own checks, be read back after the run or stay at verl's default, and not be one the
reference cannot follow. Where verl cannot be imported the scenario SKIPs (engines/verl/source.py) and these
checks wait for a machine that has it.
"""

from __future__ import annotations

from typing import Any

from parity.engines.verl import keys as verl_keys
from parity.engines.verl import source
from parity.engines.verl.keys import BLOCK, EngineKeys
from parity.engines.verl.vocabulary import prepare_tree, verl_sequence_parallel


def prepare_fsdp(raw: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    return prepare_tree(raw, verl_keys.FSDP)


def fsdp_errors(scenario: Any, shape: Any) -> list[tuple[str, str]]:
    return decay_group_errors(scenario, "none", "verl's FSDP engine builds torch's optimizer over every parameter "
                                                "(verl/workers/config/optimizer.py build_optimizer)") \
        + errors(scenario, "ppo_trainer", verl_keys.FSDP)


def decay_group_errors(scenario: Any, groups: str, why: str) -> list[tuple[str, str]]:
    """The weight-decay groups the engine builds must be the workload's (they only matter with weight decay)."""
    workload = scenario.workload
    if workload.weight_decay and workload.weight_decay_exempt != groups:
        return [("workload.weight_decay_exempt", f"{scenario.engine_label} decays with weight_decay_exempt "
                                                 f"{groups!r}, not {workload.weight_decay_exempt!r}: {why}")]
    return []


def errors(scenario: Any, config_name: str, keys: EngineKeys) -> list[tuple[str, str]]:
    flat: dict[str, Any] = scenario.actor_rollout_ref
    if scenario.workload.loss != "grpo":
        return [("workload.loss", "the verl engines train with verl's actor loss (ppo_loss): use loss grpo")]
    if scenario.workload.adv_estimator == "gae":
        return [("workload.adv_estimator", "gae needs verl's critic (a value model trained beside the actor, "
                                           "verl/workers/engine_workers.py has no critic role here): the verl "
                                           "engines run grpo, rloo and reinforce_plus_plus")]
    strategy = flat.get("actor.strategy", keys.backends[0])
    if strategy not in keys.backends:
        return [(f"{BLOCK}.actor.strategy", f"{scenario.engine_label} builds verl's {' / '.join(keys.backends)} "
                                            f"engine, not {strategy!r}")]
    problems = [(f"{BLOCK}.{key}", f"{value!r} is not taken: {refused.why} (only {refused.allowed!r})")
                for key, value in flat.items()
                if (refused := keys.refused.get(key)) is not None and not verl_keys.same_value(value, refused.allowed)]
    if not scenario.workload.use_kl_loss:
        problems += [(f"{BLOCK}.{key}", "verl's ref worker runs only for the KL loss (actor.use_kl_loss): nothing "
                                        "would read it") for key in flat if key.startswith("ref.")]
    if flat.get("actor.use_dynamic_bsz") and flat.get("actor.ppo_micro_batch_size_per_gpu") is not None:
        problems.append((f"{BLOCK}.actor.ppo_micro_batch_size_per_gpu",
                         "with use_dynamic_bsz verl ignores it (it splits micro-batches by ppo_max_token_len_per_gpu): "
                         "nothing could show it applied; leave it out"))
    if problems or source.problem() is not None:
        return problems
    from parity.engines.verl.config import VerlConfigError, validate

    try:
        defaults = validate(config_name, flat)
    except VerlConfigError as exc:
        return [(f"{BLOCK}.{exc.key}", str(exc))]
    for key, value in flat.items():
        if key in keys.refused or keys.read_back_for(key) is not None:
            continue
        if not verl_keys.same_value(value, defaults.get(key)):
            problems.append((f"{BLOCK}.{key}", f"{value!r} differs from verl's default {defaults.get(key)!r}, and "
                                               "the harness has no read-back that shows verl applied it "
                                               "(docs/verl.md lists the keys it reads back)"))
    return problems


# ---- verl's Megatron engine (and its MindSpeed subclass) -------------------------------------------------------
_ETP = "actor.megatron.expert_tensor_parallel_size"


_MIN_LR = "actor.optim.min_lr"
_SP = "actor.megatron.sequence_parallel"


def prepare_megatron(raw: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The Megatron key table; the expert TP size, whose None verl reads as 'the same as tp', follows the layout's
    (layout.etp with ep > 1, tp otherwise: engines/megatron/rules.py expert_tensor_parallel); Megatron's absolute
    min_lr is the workload's min_lr_ratio x lr."""
    out, problems = prepare_tree(raw, verl_keys.MEGATRON)
    if problems:
        return out, problems
    problems += _min_lr(out)
    flat, layout = out[BLOCK], out.get("layout") or {}
    if flat.get(_SP) and "sequence_parallel" not in (raw.get("layout") or {}) \
            and not verl_sequence_parallel(layout.get("tp", 1), True):
        flat[_SP] = False  # what verl's config does with it (its generated default is true)
        layout = out["layout"] = {**layout, "sequence_parallel": False}
    tp, ep, etp = (int(layout.get(k, 1)) for k in ("tp", "ep", "etp"))
    wanted = etp if ep > 1 else tp
    given = flat.get(_ETP)
    if given is None:
        flat[_ETP] = wanted if ep > 1 else None
    elif int(given) != wanted:
        problems.append((f"{BLOCK}.{_ETP}", f"{given!r} disagrees with the scenario's layout (expert TP "
                                            f"{wanted}: layout.etp with ep > 1, tp otherwise): give it once"))
    return out, problems


def _min_lr(out: dict[str, Any]) -> list[tuple[str, str]]:
    """actor.optim.min_lr (Megatron's OptimizerConfig, absolute) restates the workload's min_lr_ratio x lr: given,
    it sets the ratio (or must agree with it); not given, it is written away from its default 0."""
    from parity.harness.contract.schema import Workload

    flat, workload = out[BLOCK], dict(out.get("workload") or {})
    lr = float(workload.get("lr", Workload.model_fields["lr"].default))
    ratio = workload.get("min_lr_ratio")
    given = flat.get(_MIN_LR)
    if given is None:
        if ratio:
            flat[_MIN_LR] = float(ratio) * lr
        return []
    if ratio is None:
        out["workload"] = {**workload, "min_lr_ratio": float(given) / lr}
        return []
    if abs(float(given) - float(ratio) * lr) > 1e-12 * lr:
        return [(f"{BLOCK}.{_MIN_LR}", f"{given!r} disagrees with the scenario's workload.min_lr_ratio x lr = "
                                       f"{float(ratio) * lr!r}: give it once")]
    return []


def megatron_errors(scenario: Any, shape: Any) -> list[tuple[str, str]]:
    flat: dict[str, Any] = scenario.actor_rollout_ref
    problems = decay_group_errors(scenario, "biases_and_norms", "verl's Megatron engine builds Megatron's default "
                                                                "param groups (verl/utils/megatron/optimizer.py "
                                                                "get_megatron_optimizer passes no overrides)")
    problems += errors(scenario, "ppo_megatron_trainer", verl_keys.MEGATRON)
    ddp = {key.rsplit(".", 1)[1]: value for key, value in flat.items()
           if key.startswith("actor.megatron.override_ddp_config.")}
    if "bucket_size" in ddp and not ddp.get("overlap_grad_reduce", False):
        # megatron/core/distributed/distributed_data_parallel.py sets it to None without overlap: nothing to read
        problems.append((f"{BLOCK}.actor.megatron.override_ddp_config.bucket_size",
                         "Megatron's DDP discards bucket_size unless overlap_grad_reduce is on, so no read-back "
                         "could tell whether verl applied it: give override_ddp_config.overlap_grad_reduce: true"))
    if (scenario.strategy != "verl_mindspeed" and scenario.device == "cpu" and scenario.layout.cp > 1
            and scenario.workload.packing != "packed"):
        problems.append(("layout.cp", "verl_megatron on CPU builds Megatron's local spec, whose core attention "
                                      "refuses context parallelism; packed rows (model.use_remove_padding: true) "
                                      "take the project's CPU THD attention under CP (the emulated NPU lane runs "
                                      "verl_mindspeed's padded CP through MindSpeed's attention)"))
    if not flat.get("actor.megatron.vanilla_mbridge", False) and not _has_megatron_bridge():
        problems.append((f"{BLOCK}.actor.megatron.vanilla_mbridge",
                         "verl's default model bridge (Megatron-Bridge, megatron.bridge) is not installed here: "
                         "give vanilla_mbridge: true to build through mbridge"))
    return problems


def _has_megatron_bridge() -> bool:
    """Whether megatron.bridge is installed, found without importing `megatron` (MindSpeed must patch Megatron
    before anything imports it)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("megatron")
    return spec is not None and any((Path(where) / "bridge" / "__init__.py").is_file()
                                    for where in spec.submodule_search_locations or ())


def mindspeed_environment_problem() -> str | None:
    """verl's version, then the MindSpeed tree's pairing with the installed megatron-core."""
    from parity.engines.mindspeed.env import megatron_pairing_problem

    return source.problem() or megatron_pairing_problem()
