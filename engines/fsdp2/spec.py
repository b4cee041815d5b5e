"""The `fsdp2` family's spec."""

from __future__ import annotations

from parity.harness.contract.spec import PACKINGS, EngineSpec, MemoryTraits, VerlNames

#: fsdp2 loads as verl does: rank 0 on the host, the others on meta, tensors broadcast into their shards
FSDP2_MEMORY = MemoryTraits(sharding="fully_sharded", load="rank0_broadcast")

FSDP2 = EngineSpec(
    name="fsdp2", engine="parity.engines.fsdp2.engine:FSDP2Engine", aliases=("fsdp",),
    summary="transformers model under torch FSDP2 fully_shard, with Ulysses sequence parallel or 2-D FSDP x TP",
    packings=PACKINGS, checkpoints=("resume", "convert"),
    dims=frozenset({"dp", "ulysses", "tp"}), kwargs_blocks=("fsdp_kwargs",),
    rules="parity.engines.fsdp2.rules:layout_errors", memory=FSDP2_MEMORY, hf_modeling=True,
    preload=("transformers", "torch.distributed.fsdp", "parity.engines.fsdp2.engine"),
    verl=VerlNames(family="fsdp", block="fsdp_config", config="FSDPEngineConfig", implied=True, default=True))
