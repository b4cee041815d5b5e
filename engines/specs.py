"""The registry of built-in engines: each family's specs (engines/<family>/spec.py, torch-free facts the harness
reads before it runs anything), listed once in BUILTIN. Adding a built-in family = its package + one line here
(docs/architecture.md)."""

from __future__ import annotations

from parity.engines.fsdp2.spec import FSDP2
from parity.engines.hf.spec import HF
from parity.engines.hf.spec import TRANSFORMERS_WARM as TRANSFORMERS_WARM  # the registry's preload reads it here
from parity.engines.megatron.spec import MEGATRON
from parity.engines.mindspeed.spec import MINDSPEED_FSDP, MINDSPEED_MEGATRON
from parity.engines.verl.spec import VERL_FSDP, VERL_MEGATRON, VERL_MINDSPEED
from parity.harness.contract.spec import EngineSpec

BUILTIN: tuple[EngineSpec, ...] = (HF, FSDP2, MEGATRON, MINDSPEED_MEGATRON, MINDSPEED_FSDP, VERL_FSDP,
                                   VERL_MEGATRON, VERL_MINDSPEED)

#: verl's vocabulary, the one translation of verl's config names into scenarios (both spellings: a `verl:` block for
#: the engines above, `actor_rollout_ref` for verl's own): read through the registry, as every engine module is
VERL_VOCABULARY = "parity.engines.verl.vocabulary"

SPECS: dict[str, EngineSpec] = {spec.name: spec for spec in BUILTIN}
#: accepted other spellings -> strategy name
ALIASES: dict[str, str] = {alias: spec.name for spec in BUILTIN for alias in spec.aliases}
#: retired strategy names -> (new name, why)
RETIRED: dict[str, tuple[str, str]] = {old: (spec.name, why) for spec in BUILTIN for old, why in spec.retired.items()}


def canonical(strategy: str) -> str:
    return ALIASES.get(strategy, strategy)
