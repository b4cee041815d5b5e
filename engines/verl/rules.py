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


def prepare_fsdp(raw: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    return verl_keys.prepare(raw, verl_keys.FSDP)


def fsdp_errors(scenario: Any, shape: Any) -> list[tuple[str, str]]:
    return errors(scenario, "ppo_trainer", verl_keys.FSDP)


def errors(scenario: Any, config_name: str, keys: EngineKeys) -> list[tuple[str, str]]:
    flat: dict[str, Any] = scenario.actor_rollout_ref
    if scenario.workload.loss != "grpo":
        return [("workload.loss", "the verl engines train with verl's actor loss (ppo_loss): use loss grpo")]
    strategy = flat.get("actor.strategy", keys.backends[0])
    if strategy not in keys.backends:
        return [(f"{BLOCK}.actor.strategy", f"{scenario.engine_label} builds verl's {' / '.join(keys.backends)} "
                                            f"engine, not {strategy!r}")]
    problems = [(f"{BLOCK}.{key}", f"{value!r} is not taken: {refused.why} (only {refused.allowed!r})")
                for key, value in flat.items()
                if (refused := keys.refused.get(key)) is not None and not verl_keys.same_value(value, refused.allowed)]
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
