"""Known strategy names and the historic names users still have in their YAML.

verl renamed the MindSpeed strategy and its kwargs blocks twice in three months; a renamed key that is
silently accepted (or silently ignored) costs days. Validation names the new spelling; `parity migrate`
rewrites files.
"""

from __future__ import annotations

STRATEGIES: dict[str, str] = {
    "hf": "engines.hf:HFEngine",
    "fsdp2": "engines.fsdp2:FSDP2Engine",
    "megatron": "engines.megatron:MegatronEngine",
    "mindspeed_megatron": "engines.mindspeed_megatron:MindSpeedMegatronEngine",
    "mindspeed_fsdp": "engines.mindspeed_fsdp:MindSpeedFSDPEngine",
}

#: old strategy value -> new strategy value
RENAMED_STRATEGIES: dict[str, str] = {
    "mindspeed_llm": "mindspeed_megatron",
}

#: old scenario key -> (new key or None, explanation)
RENAMED_KEYS: dict[str, tuple[str | None, str]] = {
    "llm_kwargs": ("mcore_kwargs", "MindSpeed-LLM kwargs are Megatron-Core settings: they live in 'mcore_kwargs'"),
    "mm_kwargs": ("fsdp_kwargs", "MindSpeed-MM kwargs went to the FSDP engine: they live in 'fsdp_kwargs'"),
}
