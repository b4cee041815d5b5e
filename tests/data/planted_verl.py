"""verl engines with a defect planted, to prove the verl read-backs and the numbers catch what a verl regression
would do. Each is still built by verl's EngineRegistry (a subclass of verl's own engine registered under a device
key of its own, which the harness engine selects as it selects 'cuda'), and each drops or swaps ONE thing silently.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

from parity.engines.verl.fsdp import VerlFSDPEngine


def _register(device: str, method: str, replacement: Any) -> None:
    """A subclass of verl's FSDPEngineWithLMHead whose `method` runs `replacement(original, self, ...)`."""
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    registry = EngineRegistry._engines["language_model"]
    if device in registry.get("fsdp2", {}):
        return
    original = getattr(FSDPEngineWithLMHead, method)

    def planted(self: Any, *args: Any, **kwargs: Any) -> Any:
        return replacement(original, self, *args, **kwargs)

    cls = type(f"Planted{method.title().replace('_', '')}", (FSDPEngineWithLMHead,), {method: planted})
    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=device)(cls)


def _build_ignoring_reshard(original: Any, self: Any, module: Any) -> Any:
    """`fsdp_config.reshard_after_forward` silently dropped: the FSDP units are built with the default (True)."""
    object.__setattr__(self.engine_config, "reshard_after_forward", True)
    return original(self, module)


class DropsReshardAfterForward(VerlFSDPEngine):
    engine_device: ClassVar[str] = "planted-drops-reshard"

    def before_build(self) -> None:
        _register(self.engine_device, "_build_fsdp_module", _build_ignoring_reshard)


class TokenMeanLoss(VerlFSDPEngine):
    """The actor loss bound to a config whose loss_agg_mode is token-mean, whatever the scenario's: a worker that
    builds the loss from a stale or default config."""

    def loss_function(self) -> Any:
        from verl.workers.utils.losses import ppo_loss

        actor = self.configs.actor
        stale = dataclasses.replace(actor, loss_agg_mode="token-mean")
        return functools.partial(ppo_loss, config=stale)


def _raise_on_rank_1(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("planted: verl's forward_backward_batch failed on rank 1")
    return original(self, *args, **kwargs)


class CrashesInsideVerl(VerlFSDPEngine):
    """verl's engine raises on rank 1 in its first forward-backward: the run must ERROR with verl's traceback."""

    engine_device: ClassVar[str] = "planted-crashes"

    def before_build(self) -> None:
        _register(self.engine_device, "forward_backward_batch", _raise_on_rank_1)
