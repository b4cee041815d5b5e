"""Capability probes for the megatron-core releases this engine supports (the range is MEGATRON_CORE in
engines/megatron/spec.py): each asks the installed Megatron what it accepts and calls it that way.

No version comparisons: a probe reads a signature, a dataclass field or an attribute, and it does so at CALL
time, looking functions up on their module then, so that MindSpeed's patches (applied after import) and vendor
backports take the path of the API they actually have. docs/megatron.md lists what differs between releases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from parity.engines.megatron.spec import MEGATRON_CORE


def takes(func: Callable[..., Any], name: str) -> bool:
    """True if `func` declares a parameter called `name` (a bare **kwargs does not count: it proves nothing)."""
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


def positional_arity(func: Callable[..., Any]) -> int:
    """How many positional parameters `func` declares."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in inspect.signature(func).parameters.values())


def has_field(cls: type, name: str) -> bool:
    """True if the dataclass `cls` has a field `name`."""
    return any(f.name == name for f in dataclasses.fields(cls))


def megatron_version() -> str:
    """The installed megatron-core's own version string (also right for a source tree without pip metadata)."""
    from megatron.core import package_info

    return str(package_info.__version__)


def unsupported_version() -> str | None:
    """Why the installed megatron-core cannot be used (None: it is in the supported range). Validation SKIPs
    with the same words through the spec's Requirement; this catches what pip metadata cannot see (a source
    tree on PYTHONPATH) at setup, before anything is patched."""
    installed, supported = megatron_version(), MEGATRON_CORE.versions
    try:
        inside = Version(installed) in SpecifierSet(supported, prereleases=True)
    except InvalidVersion:
        inside = False
    return None if inside else f"megatron-core {installed} is installed; this engine supports {supported}"


def require_supported_version() -> None:
    if (problem := unsupported_version()) is not None:
        raise RuntimeError(problem)


# ---- virtual pipeline stages ---------------------------------------------------------------------------------
def vp_stage_kwargs(func: Callable[..., Any], vp_stage: int | None) -> dict[str, Any]:
    """`vp_stage=` for builders that take it (0.13 on). Without it a chunk's stage is the global virtual-pipeline
    rank, which `building_stage` sets."""
    return {"vp_stage": vp_stage} if takes(func, "vp_stage") else {}


@contextlib.contextmanager
def building_stage(vp_stage: int | None) -> Iterator[None]:
    """Make `vp_stage` the global virtual-pipeline rank while one model chunk is built, where GPTModel has no
    `vp_stage` parameter (it then reads the layer offset and first / last stage from the global rank)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    if vp_stage is None or takes(GPTModel.__init__, "vp_stage"):
        yield
        return
    previous = parallel_state.get_virtual_pipeline_model_parallel_rank()
    parallel_state.set_virtual_pipeline_model_parallel_rank(vp_stage)
    try:
        yield
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_rank(previous)


def is_first_stage(vp_stage: int | None) -> bool:
    """Whether this rank's chunk `vp_stage` is the first pipeline stage (virtual stages counted)."""
    from megatron.core import parallel_state

    func = parallel_state.is_pipeline_first_stage
    return func(ignore_virtual=False, **vp_stage_kwargs(func, vp_stage))


def is_last_stage(vp_stage: int | None) -> bool:
    """Whether this rank's chunk `vp_stage` is the last pipeline stage (virtual stages counted)."""
    from megatron.core import parallel_state

    func = parallel_state.is_pipeline_last_stage
    return func(ignore_virtual=False, **vp_stage_kwargs(func, vp_stage))


def is_last_physical_stage() -> bool:
    """Whether this rank is on the last pipeline stage. `ignore_virtual` is passed explicitly: its default is
    False up to 0.12 (then the answer depends on whichever chunk the schedule ran last) and True from 0.13."""
    from megatron.core import parallel_state

    return parallel_state.is_pipeline_last_stage(ignore_virtual=True)


# ---- context parallel ----------------------------------------------------------------------------------------
def pos_emb_on_this_cp_rank(emb: Any, seq_dim: int, cp_group: Any) -> Any:
    """This CP rank's slice of a RoPE table, by the function Megatron's RotaryEmbedding itself uses (looked up
    now, so a MindSpeed replacement is the one called): 3 arguments from 0.13, 2 (global CP group) before and in
    MindSpeed's own version."""
    from megatron.core.models.common.embeddings import rotary_pos_embedding

    func = rotary_pos_embedding.get_pos_emb_on_this_cp_rank
    if positional_arity(func) >= 3:
        return func(emb, seq_dim, cp_group)
    return func(emb, seq_dim)


def cp_group_of(pg_collection: Any = None, model_comm_pgs: Any = None) -> Any:
    """The CP group a core-attention module was handed (`model_comm_pgs` in 0.13 / 0.14, `pg_collection` from
    0.15), else the global one (0.12 hands none)."""
    from megatron.core import parallel_state

    for given in (pg_collection, model_comm_pgs):
        group = getattr(given, "cp", None)
        if group is not None:
            return group
    return parallel_state.get_context_parallel_group()


# ---- tensor parallel -----------------------------------------------------------------------------------------
def tp_group_of(linear: Any) -> Any:
    """A parallel linear layer's TP group (`tp_group` from 0.13; 0.12 layers use the global group)."""
    from megatron.core import parallel_state

    group = getattr(linear, "tp_group", None)
    return group if group is not None else parallel_state.get_tensor_model_parallel_group()


# ---- optimizer -----------------------------------------------------------------------------------------------
def adamw_kwargs() -> dict[str, Any]:
    """OptimizerConfig settings for torch.optim.AdamW's decoupled weight decay: `decoupled_weight_decay=True`
    where the field exists (0.15 on); before it, 'adam' always is AdamW."""
    from megatron.core.optimizer import OptimizerConfig

    return {"decoupled_weight_decay": True} if has_field(OptimizerConfig, "decoupled_weight_decay") else {}


def _never_exempt(name: str, param: Any) -> bool:
    """no_weight_decay_cond: no parameter is exempt from weight decay."""
    return False


def decay_every_param_kwargs() -> dict[str, Any]:
    """get_megatron_optimizer arguments that put weight decay on every parameter, as torch.optim.AdamW over
    model.parameters() does: `config_overrides={}` (0.16; None means 'skip biases and norms'), else a
    `no_weight_decay_cond` that never skips (its default skips biases and 1-D params)."""
    from megatron.core import optimizer

    if takes(optimizer.get_megatron_optimizer, "config_overrides"):
        return {"config_overrides": {}}
    return {"no_weight_decay_cond": _never_exempt}


# ---- distributed checkpoint --------------------------------------------------------------------------------
def dist_ckpt_metadata(distributed_optimizer: bool, fully_reshardable: bool) -> dict[str, Any]:
    """The sharded-state-dict metadata verl's MegatronCheckpointManager passes (_build_sharded_state_dict_metadata):
    the distributed optimizer's state `dp_reshardable` (its default, and Megatron-LM's: loadable on another DP size
    only) or, when the model parallelism changes (Megatron-LM's --dist-ckpt-optim-fully-reshardable, verl's
    dist_ckpt_optim_fully_reshardable), `fully_reshardable` (layout-free: any TP / PP / DP loads it); before 0.14,
    which has neither, `fully_sharded_model_space`."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    if not hasattr(DistributedOptimizer, "sharded_param_state_fully_reshardable"):
        return {"distrib_optim_sharding_type": "fully_sharded_model_space"} if distributed_optimizer else {}
    metadata: dict[str, Any] = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if distributed_optimizer:
        metadata["distrib_optim_sharding_type"] = "fully_reshardable" if fully_reshardable else "dp_reshardable"
    return metadata


def metadata_kwargs(owner: Any, metadata: dict[str, Any]) -> dict[str, Any]:
    """`metadata=` for a sharded_state_dict that takes it: a model's own method, or for an optimizer the base
    class's (Megatron's ChainedOptimizer hands it on through **kwargs)."""
    from megatron.core.optimizer import MegatronOptimizer

    method = MegatronOptimizer.sharded_state_dict if isinstance(owner, MegatronOptimizer) else owner.sharded_state_dict
    return {"metadata": metadata} if takes(method, "metadata") else {}


#: the record's name for allocate_optimizer_state's CPU stand-in (the Megatron engine's and verl's, docs/verl.md)
FRESH_OPTIMIZER_STATE = "fresh-distributed-optimizer-state"


def allocate_optimizer_state(optimizer: Any) -> bool:
    """Before a fresh distributed optimizer loads a checkpoint: without Apex / Transformer Engine (torch's AdamW
    fallback, `HAVE_APEX_OR_TE` False) its `state_dict()` reads the step count from the inner optimizer's state and
    asserts there is one (megatron/core/optimizer/distrib_optimizer.py state_dict), which a torch optimizer only
    allocates at its first step. Each such inner optimizer steps once with zero gradients at lr 0 and weight decay 0
    (no parameter moves), as torch's own DCP state-dict helper allocates it (torch/distributed/checkpoint/
    state_dict.py _init_optim_state); the load then overwrites moments and step counts. A no-op with Apex / TE
    (their fused Adam keeps the step in the param groups) or once a step was taken. Returns whether it allocated
    anything (the run's record then declares it: a CPU stand-in for what TE's fused Adam does)."""
    import torch
    from megatron.core.optimizer import distrib_optimizer

    if getattr(distrib_optimizer, "HAVE_APEX_OR_TE", True):
        return False
    allocated = False
    for inner in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        if not isinstance(inner, distrib_optimizer.DistributedOptimizer) or inner.optimizer.state:
            continue
        allocated = True
        torch_optimizer = inner.optimizer
        saved = [(group["lr"], group.get("weight_decay", 0.0)) for group in torch_optimizer.param_groups]
        for group in torch_optimizer.param_groups:
            group["lr"], group["weight_decay"] = 0.0, 0.0
            for param in group["params"]:
                param.grad = torch.zeros_like(param)
        torch_optimizer.step()
        for group, (lr, weight_decay) in zip(torch_optimizer.param_groups, saved, strict=True):
            group["lr"], group["weight_decay"] = lr, weight_decay
            for param in group["params"]:
                param.grad = None
    return allocated
