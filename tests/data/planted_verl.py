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
    """verl's worker binds its actor loss to a config whose loss_agg_mode is token-mean, whatever the scenario's: a
    worker that builds the loss from a stale or default config (ActorRolloutRefWorker.init_model's binding)."""

    def before_build(self) -> None:
        from verl.workers import engine_workers

        original = engine_workers.ActorRolloutRefWorker.init_model

        def init_model(worker: Any) -> None:
            original(worker)
            if worker.actor is not None:
                stale = dataclasses.replace(worker.loss_fn.keywords["config"], loss_agg_mode="token-mean")
                worker.loss_fn = functools.partial(engine_workers.ppo_loss, config=stale)
                worker.actor.set_loss_fn(worker.loss_fn)

        engine_workers.ActorRolloutRefWorker.init_model = init_model


# ---- verl's worker and trainer, each with one defect planted (engines/verl/engine.py drives them) ------------------
def _wrap(owner: Any, name: str, make: Any) -> None:
    """owner.name becomes make(original); the rank's process ends with the run, and the patch with it."""
    setattr(owner, name, make(getattr(owner, name)))


class DropsTokenBudget(VerlFSDPEngine):
    """A key dropped between verl's config and its engine: the TrainingWorker builds its engine with a token budget
    4x the actor's ppo_max_token_len_per_gpu (a worker copying the wrong section's budget)."""

    def before_build(self) -> None:
        from verl.workers import engine_workers

        def make(original: Any) -> Any:
            def init(worker: Any, config: Any) -> None:
                if config.engine_config.max_token_len_per_gpu:
                    config.engine_config.max_token_len_per_gpu *= 4
                original(worker, config)
            return init

        _wrap(engine_workers.TrainingWorker, "__init__", make)


class SchedulerPerMiniBatch(VerlFSDPEngine):
    """verl's worker steps the lr scheduler after every mini-batch instead of the step's last
    (TrainingWorker.train_mini_batch's update_lr_scheduler)."""

    def before_build(self) -> None:
        from verl.utils import tensordict_utils as tu
        from verl.workers import engine_workers

        def make(original: Any) -> Any:
            def train_batch(worker: Any, data: Any) -> Any:
                tu.assign_non_tensor(data, update_lr_scheduler=True)
                return original(worker, data)
            return train_batch

        _wrap(engine_workers.TrainingWorker, "train_batch", make)


class AdvantagesOverTheBatch(VerlFSDPEngine):
    """verl's GRPO advantages normalised over the whole batch instead of each prompt's group (every row one uid)."""

    def before_build(self) -> None:
        import numpy as np
        from verl.trainer.ppo import core_algos

        def make(original: Any) -> Any:
            def grpo(*args: Any, **kwargs: Any) -> Any:
                kwargs["index"] = np.array(["batch"] * len(kwargs["index"]), dtype=object)
                return original(*args, **kwargs)
            return grpo

        _wrap(core_algos, "compute_grpo_outcome_advantage", make)


class KLSignFlipped(VerlFSDPEngine):
    """verl's KL term enters the actor loss with its sign flipped (kl_penalty returns -KL)."""

    def before_build(self) -> None:
        from verl.workers.utils import losses

        _wrap(losses, "kl_penalty", lambda original: lambda *a, **k: -original(*a, **k))


class ClipHighIgnored(VerlFSDPEngine):
    """verl's vanilla policy loss clips the ratio above at 1 + clip_ratio_low, ignoring clip_ratio_high (the
    function registered as 'vanilla' swapped, the config it is called with unchanged)."""

    def before_build(self) -> None:
        from verl.trainer.ppo import core_algos

        original = core_algos.POLICY_LOSS_REGISTRY["vanilla"]

        def vanilla(*args: Any, config: Any, **kwargs: Any) -> Any:
            return original(*args, config=dataclasses.replace(config, clip_ratio_high=config.clip_ratio_low),
                            **kwargs)

        core_algos.POLICY_LOSS_REGISTRY["vanilla"] = vanilla


class CleanWorkerTwin(VerlFSDPEngine):
    """The planted classes' twin: the same hook, nothing changed."""

    def before_build(self) -> None:
        from verl.workers import engine_workers

        _wrap(engine_workers.TrainingWorker, "train_batch", lambda original: original)


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
