"""The `megatron` family's spec, and the Megatron facts the MindSpeed and verl Megatron engines share."""

from __future__ import annotations

from parity.harness.contract.spec import PACKINGS, EngineSpec, MemoryTraits, Requirement, VerlNames

#: Megatron settings the scenario's layout owns: kwarg name -> the layout field that sets it. verl's McoreEngineConfig
#: uses the same names, so `verl:` blocks translate through this table too.
MEGATRON_LAYOUT_KEYS: dict[str, str] = {
    "tensor_model_parallel_size": "layout.tp",
    "pipeline_model_parallel_size": "layout.pp",
    "virtual_pipeline_model_parallel_size": "layout.vpp",
    "context_parallel_size": "layout.cp",
    "expert_model_parallel_size": "layout.ep",
    "expert_tensor_parallel_size": "layout.etp",
    "sequence_parallel": "layout.sequence_parallel",
}
MEGATRON_DIMS = frozenset({"dp", "tp", "pp", "vpp", "cp", "ep", "etp", "sequence_parallel"})
#: the Megatron engines read only their shard's tensors (engines/megatron/hf_weights.py) and run the schedule over
#: micro-batches of mcore_kwargs.micro_batch_size rows
MEGATRON_MEMORY = MemoryTraits(sharding="model_parallel", load="sharded_read", grad_buffer=True, cpu_layer_factor=1.9,
                               cpu_attention_matrix=True,
                               micro_batch_rows="parity.engines.megatron.rules:micro_batch_rows")

MEGATRON_CORE = Requirement(
    module="megatron.core", distribution="megatron-core", versions=">=0.12.1,<0.17",
    why="megatron-core is not installed (pip install -e '.[megatron]')")

#: the Megatron engines' dist-ckpt writer against the installed torch / numpy
MEGATRON_DIST_CKPT = "parity.engines.megatron.dist_ckpt_env:dist_ckpt_problem"

MEGATRON = EngineSpec(
    name="megatron", engine="parity.engines.megatron:MegatronEngine",
    summary="Megatron-Core GPTModel with its own schedules, DDP and optimizer",
    packings=PACKINGS, checkpoints=("resume", "convert"), checkpoint_check=MEGATRON_DIST_CKPT,
    dims=MEGATRON_DIMS, kwargs_blocks=("mcore_kwargs",), layout_keys=MEGATRON_LAYOUT_KEYS,
    rules="parity.engines.megatron.rules:megatron_layout_errors", requires=(MEGATRON_CORE,), memory=MEGATRON_MEMORY,
    upstream_defects="parity.engines.megatron.upstream:routes_alignment_padding",
    preload=("transformers", "megatron.core", "parity.engines.megatron.model"), cuda_apis=("megatron",),
    verl=VerlNames(family="megatron", block="megatron", config="McoreEngineConfig", implied=True,
                   on_npu="mindspeed_megatron"))
