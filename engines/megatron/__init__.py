"""`megatron`: a Megatron-Core GPTModel trained by Megatron's own schedules, DDP and optimizer.

`MegatronEngine` is imported lazily so that `parity.engines.megatron.rules` (layout validation) stays free of torch and
megatron imports; to warm a forkserver with Megatron, preload `parity.engines.megatron.model` (its spec does).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MegatronEngine"]


def __getattr__(name: str) -> Any:
    if name == "MegatronEngine":
        from parity.engines.megatron.engine import MegatronEngine

        return MegatronEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
