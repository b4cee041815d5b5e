"""The `mindspeed` family's specs (Ascend): MindSpeed's Megatron and FSDP engines, and the Ascend requirements
the verl MindSpeed engine shares."""

from __future__ import annotations

from parity.engines.megatron.spec import (
                                                MEGATRON_CORE,
                                                MEGATRON_DIMS,
                                                MEGATRON_DIST_CKPT,
                                                MEGATRON_LAYOUT_KEYS,
                                                MEGATRON_MEMORY,
)
from parity.harness.contract.spec import PACKINGS, EngineSpec, MemoryTraits, Requirement, VerlNames

TORCH_NPU = Requirement(module="torch_npu", why="needs torch_npu (the Ascend PyTorch adapter; installed only in "
                                                "Ascend images with CANN)")
MINDSPEED = Requirement(module="mindspeed", why="needs the mindspeed package (installed only in Ascend images; "
                                                "for the emulated lane point PARITY_MINDSPEED_SRC at a source tree)")

#: transformers models under FSDP2 that every rank loads whole (engines/hf/common.py load_hf_model), then shards
FSDP_MEMORY = MemoryTraits(sharding="fully_sharded", load="replicated")

#: what the MindSpeed engines' forkserver may import before MindSpeed patches: torch_npu imports torch's FSDP, FSDP2
#: and DTensor modules itself at import, to patch them (torch_npu/distributed/__init__.py, _apply_distributed_patch),
#: and torch._dynamo (torch_npu/utils/_dynamo.py, add_dynamo_methods), so they are in sys.modules when MindSpeed's
#: adaptor patches in any case; imported in each rank they would be a large share of a tiny emulated-lane row.
#: AutoConfig's module holds config classes only (MindSpeed's torch adaptor patches nothing in transformers, only
#: its MindSpore one does: mindspeed/mindspore/mindspore_adaptor.py). Megatron and MindSpeed stay
#: out (preload_excludes), and so do the HF modeling modules (registries built at import would keep functions
#: MindSpeed replaces later). Nothing here touches a device: the server forks ranks that open the NPU themselves.
MINDSPEED_PRELOAD = ("transformers", "transformers.models.auto.configuration_auto", "torch.distributed.fsdp",
                     "torch._dynamo")

MINDSPEED_MEGATRON = EngineSpec(
    name="mindspeed_megatron", engine="parity.engines.mindspeed.megatron:MindSpeedMegatronEngine",
    summary="the Megatron engine with Ascend MindSpeed's adaptor re-patched for the layout",
    packings=PACKINGS, checkpoints=("resume", "convert"), checkpoint_check=MEGATRON_DIST_CKPT,
    retired={"mindspeed_llm": "verl renamed the MindSpeed-LLM strategy"},
    dims=MEGATRON_DIMS, kwargs_blocks=("mcore_kwargs",),
    layout_keys={**MEGATRON_LAYOUT_KEYS, "seq_length": "workload.prompt_len + workload.response_len"},
    rules="parity.engines.megatron.rules:megatron_layout_errors",
    requires=(TORCH_NPU, MINDSPEED, Requirement(module="mindspeed.megatron_adaptor",
                                                why="needs mindspeed.megatron_adaptor (MindSpeed Core)"),
              MEGATRON_CORE),
    environment_check="parity.engines.mindspeed.env:megatron_pairing_problem", memory=MEGATRON_MEMORY,
    devices=("npu",), preload=MINDSPEED_PRELOAD, preload_excludes=("megatron", "mindspeed"),
    verl=VerlNames(family="megatron", block="megatron", config="McoreEngineConfig"))

MINDSPEED_FSDP = EngineSpec(
    name="mindspeed_fsdp", engine="parity.engines.mindspeed.fsdp:MindSpeedFSDPEngine",
    summary="MindSpeed's FSDP parallel engine (mindspeed.fsdp) over a transformers model",
    packings=PACKINGS,
    retired={"mindspeed_mm": "MindSpeed-MM's FSDP path is MindSpeed's FSDP engine"},
    dims=frozenset({"dp", "tp", "ep", "ulysses"}), kwargs_blocks=("fsdp_kwargs",),
    requires=(TORCH_NPU, MINDSPEED, Requirement(
        module="mindspeed.fsdp.mindspeed_parallel_engine",
        why="needs a mindspeed with the mindspeed.fsdp package (MindSpeed's FSDP parallel engine; the branches "
            "that have it: docs/ascend.md, the pairing table)")),
    devices=("npu",), memory=FSDP_MEMORY, preload=MINDSPEED_PRELOAD, preload_excludes=("mindspeed",),
    verl=VerlNames(family="fsdp", block="fsdp_config", config="FSDPEngineConfig"))
