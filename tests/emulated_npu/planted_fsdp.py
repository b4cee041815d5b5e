"""Planted MindSpeed FSDP defects for the read-back tests (its own module: importing planted.py builds the Megatron
engine, which imports MindSpeed's megatron adaptor, and a tree with mindspeed/fsdp (master) does not pair with the
lane's megatron-core): the REAL MindSpeed FSDP, with the function that applies the prefetch plan to the wrapped
layers (mindspeed/fsdp/distributed/fully_shard_parallel/fully_shard_parallel.py `set_modules_to_prefetch`, which
`fully_shard_parallel_modules` calls by its module-global name) handed a plan without forward prefetch — a
MindSpeed that accepts the kwarg into its config and ignores it. The engine reads the prefetch back from the
layers' FSDP state, so the run FAILs with the key not applied as given."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from parity.engines.mindspeed.fsdp import MindSpeedFSDPEngine, plan_fsdp
from parity.harness.contract.engine import TORCH_DTYPES

#: the fsdp_kwarg the planted MindSpeed FSDP ignores
IGNORED_FSDP = "num_to_forward_prefetch"


class FSDPIgnoresOneKwargEngine(MindSpeedFSDPEngine):
    def setup(self) -> None:
        from mindspeed.fsdp.distributed.fully_shard_parallel import fully_shard_parallel as fsp

        real = fsp.set_modules_to_prefetch
        if not getattr(real, "planted", False):
            def ignoring(model: Any, modules: Any, plan: Any) -> Any:
                return real(model, modules, dataclasses.replace(plan, **{IGNORED_FSDP: 0}))

            ignoring.planted = True  # type: ignore[attr-defined]
            fsp.set_modules_to_prefetch = ignoring
        super().setup()


class FSDPExpertsAtDtypeEngine(MindSpeedFSDPEngine):
    """The REAL MindSpeed FSDP with its expert FSDP policy's param_dtype set here: MindSpeed hard-codes bf16
    (mindspeed/fsdp/distributed/expert_parallel/expert_fully_shard_parallel.py, master 028de58c line 17,
    `MixedPrecisionPolicy(param_dtype=torch.bfloat16, ...)`, looked up as a module global at call time).
    EXPERT_DTYPE None = the plan's param_dtype (the clean twin: a MindSpeed whose experts follow fsdp_plan);
    a dtype = that one whatever the tree does (the planted defect, as master behaves)."""

    EXPERT_DTYPE: torch.dtype | None = None

    def setup(self) -> None:
        from mindspeed.fsdp.distributed.expert_parallel import expert_fully_shard_parallel as efsp

        dtype = self.EXPERT_DTYPE or TORCH_DTYPES[plan_fsdp(self.ctx.scenario).config["fsdp_plan"]["param_dtype"]]
        real = efsp.MixedPrecisionPolicy
        efsp.MixedPrecisionPolicy = lambda **kw: real(**{**kw, "param_dtype": dtype})
        try:
            super().setup()
        finally:
            efsp.MixedPrecisionPolicy = real


class FSDPExpertsInBF16Engine(FSDPExpertsAtDtypeEngine):
    EXPERT_DTYPE = torch.bfloat16


class FSDPWrongMeshEngine(MindSpeedFSDPEngine):
    """The REAL MindSpeed FSDP wrapping ONE decoder layer (layers.1) on the wrong mesh: the 'dp' dimension of its
    device mesh, of size 1 here (fsdp = dp, so MindSpeed's derived data-parallel size is 1), so that layer's
    gradients are never reduced over the fsdp ranks (`fully_shard`, looked up as a module global by
    mindspeed/fsdp/distributed/fully_shard_parallel/fully_shard_parallel.py, gets that mesh). An engine that
    all-reduced every gradient not on an 'fsdp' / 'efsdp' mesh repaired exactly this and PASSed; now the layer keeps
    what MindSpeed gave it, the run FAILs, and the record reads the mesh back (`fsdp_meshes`)."""

    def setup(self) -> None:
        from mindspeed.fsdp.distributed.fully_shard_parallel import fully_shard_parallel as fsp
        from mindspeed.fsdp.distributed.parallel_state import ParallelState

        real = fsp.fully_shard

        def wrong_mesh_for_layer_1(module: Any, **kwargs: Any) -> Any:
            layers = getattr(getattr(self, "_hf_model", None), "model", None)
            if layers is not None and module is layers.layers[1]:
                kwargs = {**kwargs, "mesh": ParallelState().get_device_mesh("dp")}
            return real(module, **kwargs)

        fsp.fully_shard = wrong_mesh_for_layer_1
        try:
            super().setup()
        finally:
            fsp.fully_shard = real

    def wrap(self, model: torch.nn.Module) -> Any:
        self._hf_model = model
        return super().wrap(model)
