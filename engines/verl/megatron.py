"""`verl_megatron`: verl's MegatronEngineWithLMHead (megatron-core, its model built through mbridge on the
vanilla-mbridge path), and `verl_mindspeed`: verl's MindspeedEngineWithLMHead, the same engine with MindSpeed's
repatch before Megatron initialises (registered by verl for device npu). Both are built and driven by
engines/verl/engine.py; here, what is Megatron-specific: the device shims around it (engines/verl/shims.py), and
the read-backs of what verl built — every chunk's TransformerConfig and DDP config, Megatron's optimizer and its
config, the groups in megatron.core.parallel_state — and of what it ran (the max_norm Megatron clipped with).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import torch

from parity.engines.specs import VERL_MEGATRON, VERL_MINDSPEED
from parity.engines.verl import shims
from parity.engines.verl.engine import VerlEngine
from parity.engines.verl.grad_groups import GradGroups
from parity.engines.verl.keys import MEGATRON, EngineKeys
from parity.engines.verl.observe import RecordsMicroBatches
from parity.engines.verl.readback import _dtype_agreeing, agreeing, rule, unanimous
from parity.harness.contract.engine import DTYPE_NAMES


class VerlMegatronEngine(RecordsMicroBatches, GradGroups, VerlEngine):
    spec = VERL_MEGATRON
    config_name: ClassVar[str] = "ppo_megatron_trainer"
    keys: ClassVar[EngineKeys] = MEGATRON
    _device_patches: Any = None
    _clip_spy: tuple[Any, Any] | None = None

    def backend_shims(self) -> list[str]:
        names, self._device_patches = shims.apply_megatron(self.ctx.scenario.device)
        return names

    def setup(self) -> None:
        super().setup()
        # once verl built its engine: its checkpoint manager takes the tokenizer as the processing class it saves
        self.shims += shims.tokenizer_stand_in(self.engine.model_config)
        if self.ref_worker is not None:  # verl's ref worker builds its own engine from its own model config
            shims.tokenizer_stand_in(self.ref_worker.ref.engine.model_config)
        self._spy_clipping()

    def teardown(self) -> None:
        from megatron.core import parallel_state

        super().teardown()
        if self._clip_spy is not None:
            module, original = self._clip_spy
            module.clip_grad_by_total_norm_fp32 = original
            self._clip_spy = None
        parallel_state.destroy_model_parallel()
        if self._device_patches is not None:
            self._device_patches.restore()
            self._device_patches = None

    def _spy_clipping(self) -> None:
        """Record the max_norm Megatron's optimizer clips with (megatron/core/optimizer/optimizer.py calls
        clip_grad_by_total_norm_fp32 from its module namespace); calls through unchanged."""
        from megatron.core.optimizer import optimizer as megatron_optimizer

        original = megatron_optimizer.clip_grad_by_total_norm_fp32
        seen = self.observed

        @functools.wraps(original)
        def spied(parameters: Any, max_norm: Any, *args: Any, **kwargs: Any) -> Any:
            seen.clip_max_norms.append(float(max_norm))
            return original(parameters, max_norm, *args, **kwargs)

        megatron_optimizer.clip_grad_by_total_norm_fp32 = spied
        self._clip_spy = (megatron_optimizer, original)

    # ---- its checkpoint: verl's own (VerlEngine.save_checkpoint / load_checkpoint; MegatronCheckpointManager: on the
    # vanilla-mbridge path the weights in HF form through mbridge, Megatron's optimizer (fp32 main params, Adam's
    # moments) and the lr scheduler in a dist-ckpt, the RNG states in another) ---------------------------------------
    def before_load(self) -> None:
        self.shims += shims.fresh_optimizer_state(self.engine.optimizer, self.ctx.scenario.device)

    # ---- what verl built ----------------------------------------------------------------------------------------
    def chunks(self) -> list[Any]:
        """The model chunks as Megatron holds them (DDP-wrapped when training)."""
        return list(self.engine.module)

    def chunk_configs(self) -> list[Any]:
        """The TransformerConfig each chunk computes with."""
        from megatron.core.utils import get_model_config

        return [get_model_config(chunk) for chunk in self.chunks()]

    def observed_module(self) -> torch.nn.Module:
        return self.chunks()[0]

    def named_grads(self) -> list[tuple[str, Any]]:
        from parity.engines.megatron.grad_groups import named_main_grads

        return [(group, getattr(p, "main_grad", None)) for _, group, p in named_main_grads(self.chunks())]

    def group_of(self, name: str) -> str:
        return name  # named_grads names the HF group already

    def read_grad_groups(self) -> dict[str, float] | None:
        from parity.engines.megatron.grad_groups import group_grad_norms, sharded_group_grad_norms

        chunks = self.chunks()
        sharded = {bool(chunk.ddp_config.use_distributed_optimizer) for chunk in chunks}
        return sharded_group_grad_norms(chunks) if sharded == {True} else group_grad_norms(chunks)

    def built_backend(self) -> str:
        from verl.workers.engine.megatron.transformer_impl import MegatronEngine

        return "megatron" if isinstance(self.engine, MegatronEngine) else f"not Megatron ({type(self.engine)})"

    def hf_model(self) -> Any:
        raise NotImplementedError("verl's Megatron engine holds a Megatron GPTModel, not a transformers model")

    def sequence_parallel_size(self) -> int:
        # verl assigns sp_size = context_parallel_size to each batch (transformer_impl.py forward_backward_batch)
        return int(self.engine_config.context_parallel_size)

    def effective_dtype(self) -> str | None:
        dtypes = {p.dtype for chunk in self.chunks() for p in chunk.parameters()}
        return DTYPE_NAMES.get(dtypes.pop()) if len(dtypes) == 1 else None

    def optimizer_steps(self) -> int | None:
        """Megatron's optimizers keep torch's state under their inner optimizer(s)."""
        from parity.harness.contract.optim_state import torch_optimizer_steps

        optimizer = self.engine.optimizer
        inner = [getattr(o, "optimizer", o) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
        steps = {torch_optimizer_steps(o) for o in inner}
        return steps.pop() if len(steps) == 1 else None


class VerlMindSpeedEngine(VerlMegatronEngine):
    """verl's MindSpeed engine class: verl's registry returns it for device npu (VERL_ENGINE_DEVICE on CPU, where
    only the emulated torch_npu lane runs it). verl imports MindSpeed's adaptor before Megatron
    (verl/workers/engine/__init__.py) and repatches it with its override_transformer_config before model-parallel
    init (verl/workers/engine/mindspeed/transformer_impl.py); the adaptor is imported here first, as the project's
    MindSpeed engine imports it (a clean argv: MindSpeed parses sys.argv at import), with the fused-op counter."""

    spec = VERL_MINDSPEED
    engine_device: ClassVar[str] = "npu"
    _npu_shims: ClassVar[list[str]] = []

    def setup(self) -> None:
        from parity.engines.fused_ops import COUNTER
        from parity.engines.mindspeed.env import megatron_pairing_problem
        from parity.engines.mindspeed.megatron import import_adaptor
        from parity.engines.verl import source

        VERL_MINDSPEED.require()
        if problem := megatron_pairing_problem():
            raise RuntimeError(f"verl_mindspeed: {problem}")
        source.activate()
        shims.select_platform(self.ctx.scenario.device, self.engine_device)
        COUNTER.install()
        COUNTER.reset()
        import transformers  # noqa: F401 - its alias modules are in sys.modules when MindSpeed scans them

        self._hidden_modules = shims.hide_transformers_aliases()
        import_adaptor()
        self._npu_shims = [*([shims.FAST_ALIASES_WITHOUT_TORCHVISION.name] if self._hidden_modules else []),
                           *shims.import_verl_as_on_npu()]
        super().setup()

    def backend_shims(self) -> list[str]:
        # verl's imports bring transformers' alias modules back; verl's engine repatches MindSpeed next
        self._hidden_modules.update(shims.hide_transformers_aliases())
        names, self._device_patches = shims.apply_megatron(self.ctx.scenario.device, local_spec=False)
        return [*self._npu_shims, *names]

    def teardown(self) -> None:
        import sys

        try:
            super().teardown()
        finally:
            sys.modules.update(getattr(self, "_hidden_modules", {}))

    def run_provenance(self) -> dict[str, Any]:
        from parity.engines.mindspeed.megatron import mindspeed_provenance

        return {**super().run_provenance(), **mindspeed_provenance(self.chunks())}


# ---- read-backs --------------------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """Config values in the spelling a verl YAML gives them: enums by name, dtypes by verl's names."""
    import enum

    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, torch.dtype):
        return DTYPE_NAMES.get(value, str(value))
    if isinstance(value, tuple):
        return list(value)
    return value


def _field(key: str) -> str:
    return key.rsplit(".", 1)[-1]


@rule("mcore_transformer")
def mcore_transformer(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    name = _field(key)
    configs = engine.chunk_configs()
    if not all(hasattr(c, name) for c in configs):
        return f"no field {name!r} on the TransformerConfig ({type(configs[0]).__name__})"
    return agreeing(requested, unanimous([_plain(getattr(c, name)) for c in configs], f"{name} values"))


@rule("mcore_ddp")
def mcore_ddp(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    name = _field(key)
    configs = [getattr(chunk, "ddp_config", None) for chunk in engine.chunks()]
    if any(c is None for c in configs):
        return "a model chunk without DDP"
    if not all(hasattr(c, name) for c in configs):
        return f"no field {name!r} on Megatron's DistributedDataParallelConfig"
    return agreeing(requested, unanimous([_plain(getattr(c, name)) for c in configs], f"{name} values"))


def _optimizer_config(engine: VerlMegatronEngine) -> Any:
    return engine.engine.optimizer.config


@rule("mcore_optimizer")
def mcore_optimizer(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    name = _field(key)
    config = _optimizer_config(engine)
    if not hasattr(config, name):
        return f"no field {name!r} on Megatron's OptimizerConfig"
    return agreeing(requested, _plain(getattr(config, name)))


@rule("mcore_clip")
def mcore_clip(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    """The threshold in Megatron's OptimizerConfig, and the one every clip ran with (Megatron clips only when it
    is > 0)."""
    configured = _optimizer_config(engine).clip_grad
    ran = engine.observed.clip_max_norms
    if configured > 0 and not ran:
        return "no gradient clipping observed"
    return agreeing(requested, unanimous([configured, *ran], "clip thresholds"))


@rule("mcore_weight_decay")
def mcore_weight_decay(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    """Megatron's OptimizerConfig, and each observed param group that decays (wd_mult != 0; Megatron's scheduler
    sets weight_decay = wd * wd_mult)."""
    groups = [g["weight_decay"] for step in engine.observed.optimizer_groups for g in step
              if g.get("wd_mult", 1.0) != 0]
    return agreeing(requested, unanimous([_optimizer_config(engine).weight_decay, *groups], "weight decays"))


_PARALLEL_SIZES = {
    "tensor_model_parallel_size": "get_tensor_model_parallel_world_size",
    "pipeline_model_parallel_size": "get_pipeline_model_parallel_world_size",
    "virtual_pipeline_model_parallel_size": "get_virtual_pipeline_model_parallel_world_size",
    "context_parallel_size": "get_context_parallel_world_size",
    "expert_model_parallel_size": "get_expert_model_parallel_world_size",
    "expert_tensor_parallel_size": "get_expert_tensor_parallel_world_size",
}


@rule("mcore_parallel")
def mcore_parallel(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    """The group size in megatron.core.parallel_state. verl's None means 1 for the virtual pipeline and 'as tp'
    for expert TP."""
    from megatron.core import parallel_state

    name = _field(key)
    effective = getattr(parallel_state, _PARALLEL_SIZES[name])()
    if requested is None:
        unset = parallel_state.get_tensor_model_parallel_world_size() if name == "expert_tensor_parallel_size" else 1
        return requested if (effective or 1) == unset else effective
    return agreeing(requested, effective)


@rule("mcore_sequence_parallel")
def mcore_sequence_parallel(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    return agreeing(requested, unanimous([bool(c.sequence_parallel) for c in engine.chunk_configs()],
                                         "sequence_parallel values"))


@rule("mcore_dtype")
def mcore_dtype(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    """The dtype every model parameter holds, and the TransformerConfig's params_dtype."""
    dtypes = {p.dtype for chunk in engine.chunks() for p in chunk.parameters()}
    dtypes |= {c.params_dtype for c in engine.chunk_configs()}
    if len(dtypes) != 1:
        return f"parameters / params_dtype in {sorted(map(str, dtypes))}"
    return _dtype_agreeing(requested, dtypes.pop())


@rule("mcore_distributed_optimizer")
def mcore_distributed_optimizer(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    """The optimizer class verl built (Megatron's DistributedOptimizer or not), the OptimizerConfig, and the DDP
    config of every chunk (which lays out the grad buffers for it)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    optimizer = engine.engine.optimizer
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    built = [isinstance(o, DistributedOptimizer) for o in inner]
    built += [bool(_optimizer_config(engine).use_distributed_optimizer)]
    built += [bool(chunk.ddp_config.use_distributed_optimizer) for chunk in engine.chunks()]
    return agreeing(requested, unanimous(built, "distributed-optimizer settings"))


@rule("mcore_bridge")
def mcore_bridge(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    """vanilla_mbridge true: verl's bridge is mbridge's (verl.models.mcore.mbridge); false: Megatron-Bridge's."""
    module = type(engine.engine.bridge).__module__
    return agreeing(requested, module.startswith("mbridge."))


@rule("mcore_scheduler_checkpoint")
def mcore_scheduler_checkpoint(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    """Megatron's scheduler keeps the flag (optimizer_param_scheduler.py load_state_dict takes the checkpoint's
    settings with it); verl's checkpoint manager loads the scheduler's state at all only with it
    (verl/utils/checkpoint/megatron_checkpoint_manager.py:956); whether the position came back is the resume check."""
    flags = [engine.engine.lr_scheduler.use_checkpoint_opt_param_scheduler,
             not engine.engine.lr_scheduler.override_opt_param_scheduler,
             engine.engine.checkpoint_mananager.use_checkpoint_opt_param_scheduler]
    return agreeing(requested, unanimous([bool(f) for f in flags], "use_checkpoint_opt_param_scheduler settings"))


@rule("mcore_recompute")
def mcore_recompute(engine: VerlMegatronEngine, key: str, requested: Any) -> Any:
    return agreeing(requested, unanimous([c.recompute_granularity is not None for c in engine.chunk_configs()],
                                         "recompute settings"))
