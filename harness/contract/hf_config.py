"""HF config facts every engine reads the same way, whatever the transformers version."""

from __future__ import annotations

from typing import Any


def get_rope_theta(config: Any) -> float:
    """rope_theta as a float for transformers 4 (`config.rope_theta`) and 5 (`config.rope_parameters`)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(config.rope_theta)


def set_rope_theta(config: Any, value: float) -> None:
    """Write rope_theta where this transformers version reads it."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        params["rope_theta"] = float(value)
    if hasattr(config, "rope_theta") or not isinstance(params, dict):
        config.rope_theta = float(value)
