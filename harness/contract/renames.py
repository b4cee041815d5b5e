"""Scenario keys that were renamed (verl renamed the MindSpeed kwargs blocks twice in three months): validation
names the new spelling, `parity migrate` rewrites files. Renamed STRATEGY names belong to each engine's spec
(`EngineSpec.retired`)."""

from __future__ import annotations

#: old scenario key -> (new key, explanation)
RENAMED_KEYS: dict[str, tuple[str, str]] = {
    "llm_kwargs": ("mcore_kwargs", "MindSpeed-LLM kwargs are Megatron-Core settings: they live in 'mcore_kwargs'"),
    "mm_kwargs": ("fsdp_kwargs", "MindSpeed-MM kwargs went to the FSDP engine: they live in 'fsdp_kwargs'"),
}
