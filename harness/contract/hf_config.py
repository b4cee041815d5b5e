"""HF config facts every engine and the planner read the same way, whatever the transformers version, from a
transformers config object or the config.json dict alike."""

from __future__ import annotations

from typing import Any


def _levels(config: Any) -> list[Any]:
    """The config itself, then its text_config (multimodal models keep the language model's settings there)."""
    text = getattr(config, "text_config", None)
    return [config] if text is None else [config, text]


#: the names transformers' MoE configs give the routed-expert count (Qwen-MoE, Mixtral, DeepSeek)
EXPERT_COUNT_NAMES = ("num_experts", "num_local_experts", "n_routed_experts")


def _field(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def text_config(config: Any) -> Any:
    """The language model's settings: the config's text_config where it has one (multimodal models)."""
    return _field(config, "text_config") or config


def expert_count(config: Any) -> int:
    """Routed experts per MoE layer of the language model (0: dense)."""
    text = text_config(config)
    return int(next((value for name in EXPERT_COUNT_NAMES if (value := _field(text, name))), 0))


def get_rope_theta(config: Any) -> float:
    """rope_theta as a float, resolved as verl's `get_hf_rope_theta` does (verl/utils/transformers_compat.py):
    `rope_theta` on the config or its text_config (transformers 4), else `rope_parameters` of the config or its
    text_config (transformers 5), flat or nested per attention type (the first nested entry that has one)."""
    for level in _levels(config):
        value = getattr(level, "rope_theta", None)
        if value is not None:
            return float(value)
    params = next((p for p in (getattr(level, "rope_parameters", None) for level in _levels(config))
                   if p is not None), None)
    if isinstance(params, dict):
        if "rope_theta" in params:
            return float(params["rope_theta"])
        for nested in params.values():
            if isinstance(nested, dict) and "rope_theta" in nested:
                return float(nested["rope_theta"])
    raise AttributeError(f"{type(config).__name__} has no rope_theta and no rope_parameters['rope_theta'] (on "
                         "itself or its text_config): cannot determine the RoPE base")


def set_rope_theta(config: Any, value: float) -> None:
    """Write rope_theta where this transformers version reads it."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        params["rope_theta"] = float(value)
    if hasattr(config, "rope_theta") or not isinstance(params, dict):
        config.rope_theta = float(value)
