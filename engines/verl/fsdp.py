"""`verl_fsdp`: verl's FSDPEngineWithLMHead (FSDP2 `fully_shard` or FSDP1, as `actor.strategy` says), built and
driven by engines/verl/engine.py; here, what is FSDP-specific: which units verl wrapped and how, read back from
torch's own FSDP state of each unit."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from parity.engines.specs import VERL_FSDP
from parity.engines.verl.engine import VERL_DIR, VerlEngine
from parity.engines.verl.grad_groups import GradGroups
from parity.engines.verl.keys import FSDP, EngineKeys
from parity.engines.verl.observe import RecordsMicroBatches
from parity.engines.verl.readback import _dtype_agreeing, agreeing, built_at, rule, unanimous
from parity.harness.contract.engine import DTYPE_NAMES
from parity.harness.contract.faults import FaultPlan


def _unit_kind(engine: VerlFSDPEngine) -> str:
    return "fsdp1 module" if engine.fsdp_version() == 1 else "fsdp2 unit"


def built_unit(fn: Any) -> Any:
    """built_at for the FSDP rules: FSDP1 modules and FSDP2 units are built in different places."""
    def located(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
        return built_at(_unit_kind(engine))(fn)(engine, key, requested)
    located.__name__ = fn.__name__
    return located


class VerlFSDPEngine(RecordsMicroBatches, GradGroups, VerlEngine):
    spec = VERL_FSDP
    config_name: ClassVar[str] = "ppo_trainer"
    keys: ClassVar[EngineKeys] = FSDP

    def fingerprint_points(self) -> Any:
        """verl's FSDP-wrapped transformers model (verl/workers/engine/fsdp/transformer_impl.py FSDPEngine.module)
        under the HF names; its forward gets the input ids as verl feeds them (padded, or rmpad [1, T], sliced
        under Ulysses), so the real-token mask follows."""
        from parity.harness.contract.fingerprint import hf_points

        return hf_points(self.engine.module)

    def fsdp_version(self) -> int:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        module = self.engine.module
        return 1 if isinstance(module, FullyShardedDataParallel) else 2 if isinstance(module, FSDPModule) else 0

    def units(self) -> list[Any]:
        """(name, module) of every FSDP unit below the root (verl wraps the root too; FSDP2 never reshards it)."""
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        kind = FullyShardedDataParallel if self.fsdp_version() == 1 else FSDPModule
        return [(name, m) for name, m in self.engine.module.named_modules() if isinstance(m, kind) and name]

    def groups(self) -> list[Any]:
        """FSDP2 param groups of every unit that holds parameters."""
        return [g for _, m in self.units() if (g := m._get_fsdp_state()._fsdp_param_group) is not None]

    def named_grads(self) -> list[tuple[str, Any]]:
        from parity.engines.fsdp2.tensor_parallel import local

        return [(name, None if p.grad is None else local(p.grad)) for name, p in self.engine.module.named_parameters()]

    def read_grad_groups(self) -> dict[str, float] | None:
        """FSDP2's DTensor gradients, each norm reduced over its mesh; FSDP1's flat parameters name no module."""
        from parity.engines.fsdp2.tensor_parallel import group_grad_norms

        if self.fsdp_version() != 2:
            return None
        return group_grad_norms((name, p.grad) for name, p in self.engine.module.named_parameters())

    def built_backend(self) -> str:
        return {1: "fsdp", 2: "fsdp2"}.get(self.fsdp_version(), f"not FSDP ({type(self.engine.module).__name__})")

    def hf_model(self) -> Any:
        module = self.engine.module
        return getattr(module, "_fsdp_wrapped_module", module)

    def sequence_parallel_size(self) -> int:
        return int(self.engine.ulysses_sequence_parallel_size)

    # ---- its checkpoint: verl's own (VerlEngine.save_checkpoint / load_checkpoint; FSDPCheckpointManager: model,
    # optimizer and the lr scheduler's state (`extra`) per rank, the HF config beside them) ----------------------
    @classmethod
    def convert_checkpoint(cls, directory: Path, hf_dir: Path, base: Path, faults: FaultPlan) -> None:
        """verl's model merger (verl/model_merger/fsdp_model_merger.py), as `python -m verl.model_merger merge
        --backend fsdp` runs it: the per-rank shards of the checkpoint merged into one HF checkpoint."""
        from verl.model_merger.base_model_merger import ModelMergerConfig
        from verl.model_merger.fsdp_model_merger import FSDPModelMerger

        local = directory / VERL_DIR
        config = ModelMergerConfig(operation="merge", backend="fsdp", local_dir=str(local), target_dir=str(hf_dir),
                                   hf_model_config_path=str(local / "huggingface"))
        FSDPModelMerger(config).merge_and_save()

    def effective_dtype(self) -> str | None:
        """The param dtype FSDP computes in: the mixed-precision policy of the units, read from torch's state."""
        if self.fsdp_version() == 1:
            policy = self.engine.module.mixed_precision
            return DTYPE_NAMES.get(policy.param_dtype or torch.float32)
        dtypes = {g.mp_policy.param_dtype or torch.float32 for g in self.groups()}
        return DTYPE_NAMES.get(dtypes.pop()) if len(dtypes) == 1 else None


@rule("fsdp_reshard")
@built_unit
def fsdp_reshard(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    if engine.fsdp_version() == 1:
        from torch.distributed.fsdp import ShardingStrategy

        zero3 = {ShardingStrategy.FULL_SHARD: True, ShardingStrategy.HYBRID_SHARD: True,
                 ShardingStrategy.SHARD_GRAD_OP: False, ShardingStrategy._HYBRID_SHARD_ZERO2: False}
        return agreeing(requested, unanimous([zero3.get(m.sharding_strategy) for _, m in engine.units()],
                                             "sharding strategies"))
    return agreeing(requested, unanimous([g.post_forward_mesh_info is not None for g in engine.groups()],
                                         "reshard-after-forward settings"))


@rule("fsdp_mixed_precision")
@built_unit
def fsdp_mixed_precision(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    field = key.rsplit(".", 1)[-1]
    if field not in ("param_dtype", "reduce_dtype", "buffer_dtype"):
        return f"no mixed-precision setting {field!r} in FSDP"
    if engine.fsdp_version() == 1:
        return _dtype_agreeing(requested, getattr(engine.engine.module.mixed_precision, field) or torch.float32)
    if field == "buffer_dtype":  # FSDP2's policy has none: buffers keep the dtype the module holds them in
        buffers = {b.dtype for b in engine.engine.module.buffers() if b.is_floating_point()}
        return _dtype_agreeing(requested, buffers.pop()) if len(buffers) == 1 else f"buffers in {sorted(buffers)}"
    dtypes = [getattr(g.mp_policy, field) or torch.float32 for g in engine.groups()]
    effective = unanimous(dtypes, f"{field}s")
    return effective if isinstance(effective, str) else _dtype_agreeing(requested, effective)


@rule("master_dtype")
def master_dtype(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    dtypes = {p.dtype for p in engine.engine.module.parameters()}
    return _dtype_agreeing(requested, dtypes.pop()) if len(dtypes) == 1 else f"parameters in {sorted(map(str, dtypes))}"


@rule("resting_place")
def resting_place(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    """Where the parameters (param_offload) or the optimizer's state (optimizer_offload) rest between verl's phases,
    observed after every worker call: offloaded means on the CPU while the engine computes on an accelerator."""
    what = "params" if key.endswith("param_offload") else "optimizer"
    seen = engine.observed.resting[what]
    if not seen:
        return f"no {what} observed between phases"
    if engine.ctx.scenario.device == "cpu":
        return requested if not requested else ("on a CPU-only box everything rests on the CPU: nothing shows "
                                                "whether verl offloaded it")
    return agreeing(requested, all(devices == {"cpu"} for devices in seen))


@rule("fsdp_offload_policy")
@built_unit
def fsdp_offload_policy(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy

    if engine.fsdp_version() != 2:
        return "no FSDP2 units (offload_policy is an FSDP2 setting)"
    return agreeing(requested, unanimous([isinstance(g.offload_policy, CPUOffloadPolicy) for g in engine.groups()],
                                         "offload policies"))


@rule("fsdp_mesh")
@built_unit
def fsdp_mesh(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    """The number of ranks each unit is sharded over; verl's -1 means the whole world."""
    if engine.fsdp_version() == 1:
        sizes = [m.process_group.size() for _, m in engine.units()]
    else:
        sizes = [g.mesh_info.shard_mesh_size for g in engine.groups()]
    size = unanimous(sizes, "shard group sizes")
    if isinstance(size, str):
        return size
    world = torch.distributed.get_world_size()
    return requested if size == (world if int(requested) < 0 else int(requested)) else size


@rule("ulysses")
def ulysses(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    mesh = engine.engine.ulysses_device_mesh
    return agreeing(requested, 1 if mesh is None else mesh["sp"].size())


@rule("fsdp_wrapped")
def fsdp_wrapped(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    """Whether every module of the requested classes is an FSDP unit of its own (verl wraps the untied embedding
    and LM head as units too: those are not what the key asks about)."""
    wanted = {requested} if isinstance(requested, str) else set(requested)
    units = {id(getattr(m, "_fsdp_wrapped_module", m)) for _, m in engine.units()}
    missing = sorted({name for name, m in engine.hf_model().named_modules()
                      if _original_class(m).__name__ in wanted and id(m) not in units})
    found = any(_original_class(m).__name__ in wanted for m in engine.hf_model().modules())
    if not found:
        return f"no module of {sorted(wanted)} in the model"
    return requested if not missing else f"not FSDP units: {', '.join(missing)}"


def _original_class(module: Any) -> type:
    """The model's own class of a module (FSDP2 swaps in a subclass named FSDP<Class>)."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(getattr(module, "_fsdp_wrapped_module", module))
    if issubclass(cls, FSDPModule):
        return next(base for base in cls.__mro__[1:] if not issubclass(base, FSDPModule))
    return cls


@rule("fsdp_prefetch")
@built_unit
def fsdp_prefetch(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    if engine.fsdp_version() == 1:
        return agreeing(requested, bool(engine.engine.module.forward_prefetch))
    prefetching = [bool(m._get_fsdp_state()._states_to_forward_prefetch) for _, m in engine.units()]
    return agreeing(requested, any(prefetching))


@rule("fsdp1_orig_params")
@built_unit
def fsdp1_orig_params(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    if engine.fsdp_version() != 1:
        return "no FSDP1 module (use_orig_params is an FSDP1 setting)"
    return agreeing(requested, bool(engine.engine.module._use_orig_params))


@rule("entropy_compiled")
def entropy_compiled(engine: VerlFSDPEngine, key: str, requested: Any) -> Any:
    fn = engine.engine.compute_entropy_from_logits
    return agreeing(requested, hasattr(fn, "_torchdynamo_orig_callable") or hasattr(fn, "get_compiler_config"))

