"""What verl did, recorded while it runs: observation hooks that record their arguments and call through unchanged
(no value, dtype or order altered). The read-backs (engines/verl/readback.py) compare these with the keys given.

- the input shape every forward of the model received (packed (1, T) without a mask, or padded (B, S));
- the `max_norm` every gradient clip was called with (torch's FSDP1 `clip_grad_norm_` and the
  `_clip_grads_with_norm_` that torch's and verl's FSDP2 clipping end in);
- every optimizer param group's hyper-parameters at each `optimizer.step()`;
- the micro-batches verl's `prepare_micro_batches` made for each call (rows and tokens of each, and whether it
  split by tokens), spied in the module the engine's `forward_backward_batch` is defined in;
- the mini-batches verl's worker formed (`tensordict_utils.make_iterator`, called by `TrainingWorker.
  train_mini_batch`): the size and epochs it was asked for and the rows of each mini-batch it yielded;
- the arguments verl's actor loss was called with (`ppo_loss`'s config, the policy-loss function verl's registry
  returned and its keyword arguments, `kl_penalty`'s type), and the advantages verl's `compute_advantage` made.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch


@dataclass
class Observations:
    forward_inputs: list[tuple[tuple[int, ...], bool]] = field(default_factory=list)
    """(input_ids shape, attention_mask given) of every model forward."""
    clip_max_norms: list[float] = field(default_factory=list)
    optimizer_groups: list[list[dict[str, Any]]] = field(default_factory=list)
    """Per optimizer.step(): every param group's hyper-parameters (params left out)."""
    phase: str = "setup"
    """'infer' or 'train' while the driver is in one (set by the engine)."""
    micro_batching: list[MicroBatching] = field(default_factory=list)
    loss_configs: list[Any] = field(default_factory=list)
    """The actor config verl's loss function (ppo_loss) was called with, per micro-batch."""
    policy_losses: list[PolicyLossCall] = field(default_factory=list)
    """Every call of the policy-loss function verl's registry returned (core_algos.get_policy_loss_fn)."""
    kl_types: list[str] = field(default_factory=list)
    """The kl_penalty type of every KL-loss computation verl's actor loss made."""
    mini_batches: list[MiniBatches] = field(default_factory=list)
    """Per update_actor on this rank: the mini-batches verl's worker formed."""
    advantages: list[Any] = field(default_factory=list)
    """[B, R] advantages verl's compute_advantage made, per step."""
    resting: dict[str, list[set[str]]] = field(default_factory=lambda: {"params": [], "optimizer": []})
    """Between verl's phases (after each worker call): the device types the parameters and the optimizer's state
    tensors rest on."""

    def record_resting(self, module: Any, optimizer: Any) -> None:
        modules = module if isinstance(module, (list, tuple)) else [module]  # Megatron: its model chunks
        self.resting["params"].append({p.device.type for m in modules for p in m.parameters()})
        # torch's optimizer, or Megatron's (chained) ones around torch's: the state lives in the torch optimizers
        inner = [getattr(o, "optimizer", o) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
        states = [v for o in inner if isinstance(getattr(o, "state", None), dict)
                  for state in o.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        if states:
            self.resting["optimizer"].append({t.device.type for t in states})

    def batching(self, phase: str) -> list[MicroBatching]:
        return [b for b in self.micro_batching if b.phase == phase]


@dataclass(frozen=True)
class PolicyLossCall:
    loss_mode: str
    """The registry name the function is registered under (core_algos.POLICY_LOSS_REGISTRY)."""
    loss_agg_mode: str
    clip_ratio: float | None
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float | None


@dataclass
class MiniBatches:
    mini_batch_size: int
    """Rows per mini-batch on this rank, as verl's worker asked make_iterator for."""
    epochs: int
    batch_rows: int
    """Rows of the batch on this rank it split."""
    rows: list[int] = field(default_factory=list)
    """Rows of each mini-batch make_iterator yielded, in order, over every epoch."""



def gather_loss_calls(seen: Observations, config_fields: Iterable[str]) -> None:
    """A pipeline computes the loss on its last stage only: what verl's loss did there (its config's
    `config_fields`, the policy-loss calls, the KL types), gathered from every rank into `seen`, so the loss
    read-backs of the rank that reports read what verl did. Every rank calls it (a collective)."""
    import torch.distributed as dist

    mine = ([SimpleNamespace(**{name: getattr(config, name, None) for name in config_fields})
             for config in seen.loss_configs], seen.policy_losses, seen.kl_types)
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    seen.loss_configs = [config for configs, _, _ in every for config in configs]
    seen.policy_losses = [call for _, calls, _ in every for call in calls]
    seen.kl_types = [kind for _, _, kinds in every for kind in kinds]

@dataclass(frozen=True)
class MicroBatching:
    phase: str
    by_tokens: bool
    """verl returned the reordering indices of its token-balanced split (use_dynamic_bsz)."""
    rows: tuple[int, ...]
    tokens: tuple[int, ...]


_ACTIVE: list[Observations] = []
_patched = False

BUILD_SITES: dict[str, str] = {}
"""What built each kind of object verl asked torch for ('fsdp2 unit', 'fsdp1 module', 'optimizer') -> the first
caller outside torch and this harness (verl's file:line): a read-back that disagrees names where it was built."""


def _not_callers() -> tuple[str, ...]:
    """torch's package and this harness's own packages: a build site is the first frame outside them."""
    import parity.engines
    import parity.harness.contract

    roots = [Path(m.__file__).resolve().parent for m in (torch, parity.engines, parity.harness.contract)]
    roots[-1] = roots[-1].parent  # the whole harness package, found from the one part an engine may import
    return tuple(map(str, roots))


def _caller_site() -> str:
    import traceback

    skipped = _not_callers()
    for frame in reversed(traceback.extract_stack()[:-2]):
        filename = str(Path(frame.filename).resolve())
        if not filename.startswith(skipped):
            parts = Path(filename).parts
            short = "/".join(parts[len(parts) - 1 - parts[::-1].index("verl"):]) if "verl" in parts else filename
            return f"{short}:{frame.lineno} ({frame.name})"
    return "unknown"


def watch_builds() -> None:
    """Record where torch's FSDP units, FSDP1 modules and optimizers are constructed (class-level, so it holds
    however verl imported them); installed once per process, before verl builds its engine."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    for kind, cls in (("fsdp2 unit", FSDPParamGroup), ("fsdp1 module", FullyShardedDataParallel),
                      ("optimizer", torch.optim.Optimizer)):
        init = cls.__init__
        if getattr(init, "_parity_watched", False):
            continue

        @functools.wraps(init)
        def watched(self: Any, *args: Any, _init: Any = init, _kind: str = kind, **kwargs: Any) -> Any:
            BUILD_SITES.setdefault(_kind, _caller_site())
            return _init(self, *args, **kwargs)

        watched._parity_watched = True  # type: ignore[attr-defined]
        cls.__init__ = watched


def _record_clip(max_norm: Any) -> None:
    if _ACTIVE:
        _ACTIVE[-1].clip_max_norms.append(float(max_norm))


def _patch_clipping() -> None:
    """Class- and module-level spies, installed once per process; they record into the active Observations."""
    global _patched
    if _patched:
        return
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.nn.utils import clip_grad

    clip_with_norm = clip_grad._clip_grads_with_norm_

    @functools.wraps(clip_with_norm)
    def spied_clip_with_norm(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        _record_clip(max_norm)
        return clip_with_norm(parameters, max_norm, *args, **kwargs)

    fsdp1_clip = FullyShardedDataParallel.clip_grad_norm_

    @functools.wraps(fsdp1_clip)
    def spied_fsdp1_clip(self: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        _record_clip(max_norm)
        return fsdp1_clip(self, max_norm, *args, **kwargs)

    clip_grad._clip_grads_with_norm_ = spied_clip_with_norm
    FullyShardedDataParallel.clip_grad_norm_ = spied_fsdp1_clip
    _patched = True


def _spy_micro_batching(engine: Any, seen: Observations) -> None:
    """In every module of the engine's class hierarchy that calls verl's prepare_micro_batches by name."""
    import sys

    modules = {cls.__module__: sys.modules[cls.__module__] for cls in type(engine).__mro__}
    holders = [m for m in modules.values() if hasattr(m, "prepare_micro_batches")]
    if not holders:
        raise RuntimeError(f"no module of {type(engine).__name__}'s classes calls prepare_micro_batches: the verl "
                           "read-backs of micro-batching cannot observe this verl")
    for module in holders:
        prepare = module.prepare_micro_batches

        @functools.wraps(prepare)
        def spied_prepare(*args: Any, _prepare: Any = prepare, **kwargs: Any) -> Any:
            micro_batches, indices = _prepare(*args, **kwargs)
            seen.micro_batching.append(MicroBatching(
                phase=seen.phase, by_tokens=indices is not None, rows=tuple(len(mb) for mb in micro_batches),
                tokens=tuple(int(mb["input_ids"].values().numel()) if mb["input_ids"].is_nested
                             else int(mb["input_ids"].numel()) for mb in micro_batches)))
            return micro_batches, indices

        module.prepare_micro_batches = spied_prepare


_WORKER_SPIES: list[tuple[Any, str, Any]] = []


def watch_worker(seen: Observations) -> None:
    """Spies on what verl's worker and actor loss do, installed before verl's worker builds (its loss is bound to
    `engine_workers.ppo_loss` then). Each records its arguments into `seen` and calls through unchanged."""
    from verl.trainer.ppo import core_algos
    from verl.utils import tensordict_utils
    from verl.workers import engine_workers
    from verl.workers.utils import losses

    unwatch_worker()

    def spy(owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        _WORKER_SPIES.append((owner, name, original))
        setattr(owner, name, functools.wraps(original)(make(original)))

    def ppo_loss(original: Any) -> Any:
        def called(*args: Any, **kwargs: Any) -> Any:
            seen.loss_configs.append(kwargs["config"] if "config" in kwargs else args[0])
            return original(*args, **kwargs)
        return called

    def get_policy_loss_fn(original: Any) -> Any:
        def resolved(name: str) -> Any:
            fn = original(name)
            # the name the function is registered under now (a registry entry swapped after import shows as such)
            names = {id(f): n for n, f in core_algos.POLICY_LOSS_REGISTRY.items()}

            @functools.wraps(fn)
            def policy_loss(*args: Any, **kwargs: Any) -> Any:
                config = kwargs.get("config")
                seen.policy_losses.append(PolicyLossCall(
                    loss_mode=names.get(id(fn), getattr(fn, "__name__", repr(fn))),
                    loss_agg_mode=kwargs.get("loss_agg_mode"),
                    clip_ratio=getattr(config, "clip_ratio", None),
                    clip_ratio_low=getattr(config, "clip_ratio_low", None),
                    clip_ratio_high=getattr(config, "clip_ratio_high", None),
                    clip_ratio_c=getattr(config, "clip_ratio_c", None)))
                return fn(*args, **kwargs)
            return policy_loss
        return resolved

    def kl_penalty(original: Any) -> Any:
        def called(*args: Any, **kwargs: Any) -> Any:
            seen.kl_types.append(str(kwargs.get("kl_penalty", args[2] if len(args) > 2 else None)))
            return original(*args, **kwargs)
        return called

    def make_iterator(original: Any) -> Any:
        def called(tensordict: Any, mini_batch_size: Any, epochs: Any, *args: Any, **kwargs: Any) -> Any:
            formed = MiniBatches(mini_batch_size=int(mini_batch_size), epochs=int(epochs),
                                 batch_rows=int(tensordict.batch_size[0]))
            seen.mini_batches.append(formed)
            for mini_batch in original(tensordict, mini_batch_size, epochs, *args, **kwargs):
                formed.rows.append(int(mini_batch.batch_size[0]))
                yield mini_batch
        return called

    spy(engine_workers, "ppo_loss", ppo_loss)
    spy(losses, "get_policy_loss_fn", get_policy_loss_fn)
    spy(losses, "kl_penalty", kl_penalty)
    spy(tensordict_utils, "make_iterator", make_iterator)


def unwatch_worker() -> None:
    while _WORKER_SPIES:
        owner, name, original = _WORKER_SPIES.pop()
        setattr(owner, name, original)


def observe(seen: Observations, engine: Any, module: torch.nn.Module, optimizer: Any) -> Observations:
    """Start recording what verl's `engine`, its `module` and `optimizer` are given."""
    _ACTIVE.append(seen)
    _patch_clipping()
    _spy_micro_batching(engine, seen)

    def before_forward(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            seen.forward_inputs.append((tuple(ids.shape), kwargs.get("attention_mask") is not None))

    module.register_forward_pre_hook(before_forward, with_kwargs=True)
    if optimizer is not None:
        step = optimizer.step

        @functools.wraps(step)
        def spied_step(*args: Any, **kwargs: Any) -> Any:
            seen.optimizer_groups.append([{k: v for k, v in group.items() if k != "params"}
                                          for group in optimizer.param_groups])
            return step(*args, **kwargs)

        optimizer.step = spied_step
    return seen


class RecordsMicroBatches:
    """Mixin for a VerlEngine: the micro-batches verl's `prepare_micro_batches` made go into the run's record
    (`provenance.verl.micro_batches`: per call, whether verl split by tokens, and the sequences and tokens of each
    micro-batch on this rank), so that what a row exercises — several sequences packed into each micro-batch, a
    token budget that splits a batch unevenly — is read from what verl did, not from the scenario."""

    observed: Observations

    def run_provenance(self) -> dict[str, Any]:
        out = super().run_provenance()  # type: ignore[misc]
        calls = [{"phase": b.phase, "by_tokens": b.by_tokens, "rows": list(b.rows), "tokens": list(b.tokens)}
                 for b in self.observed.micro_batching]
        packed = sorted({shape for shape, masked in self.observed.forward_inputs if not masked and len(shape) == 2
                         and all(type(n) is int for n in shape) and shape[0] == 1})  # a nested row has no int length
        return {**out, "verl": {**out.get("verl", {}), "micro_batches": calls,
                                "packed_forward_lengths": [shape[1] for shape in packed]}}
