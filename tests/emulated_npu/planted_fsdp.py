"""A planted MindSpeed FSDP defect for the read-back test (its own module: importing planted.py builds the Megatron
engine, which imports MindSpeed's megatron adaptor, and a tree with mindspeed/fsdp (master) does not pair with the
lane's megatron-core): the REAL MindSpeed FSDP, with the function that applies the prefetch plan to the wrapped
layers (mindspeed/fsdp/distributed/fully_shard_parallel/fully_shard_parallel.py `set_modules_to_prefetch`, which
`fully_shard_parallel_modules` calls by its module-global name) handed a plan without forward prefetch — a
MindSpeed that accepts the kwarg into its config and ignores it. The engine reads the prefetch back from the
layers' FSDP state, so the run FAILs with the key not applied as given."""

from __future__ import annotations

import dataclasses
from typing import Any

from parity.engines.mindspeed_fsdp import MindSpeedFSDPEngine

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
