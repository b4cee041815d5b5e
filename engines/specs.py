"""The built-in engines' specs (parity.harness.contract.spec.EngineSpec): torch-free facts the harness reads
before it runs anything. Adding a built-in engine = its module + one spec here (+ scenarios and docs)."""

from __future__ import annotations

from parity.harness.contract.schema import RL_STEP_FIELDS
from parity.harness.contract.spec import (
    LOSS_AGG_MODES,
    PACKINGS,
    Baseline,
    EngineSpec,
    MemoryTraits,
    ReferenceRecipe,
    Requirement,
    VerlNames,
)

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
#: transformers models under FSDP2 that every rank loads whole (engines/hf_common.py load_hf_model), then shards
FSDP_MEMORY = MemoryTraits(sharding="fully_sharded", load="replicated")
#: fsdp2 loads as verl does: rank 0 on the host, the others on meta, tensors broadcast into their shards
FSDP2_MEMORY = MemoryTraits(sharding="fully_sharded", load="rank0_broadcast")

MEGATRON_CORE = Requirement(
    module="megatron.core", distribution="megatron-core", versions=">=0.12.1,<0.17",
    why="megatron-core is not installed (pip install -e '.[megatron]')")
TORCH_NPU = Requirement(module="torch_npu", why="needs torch_npu (the Ascend PyTorch adapter; installed only in "
                                                "Ascend images with CANN)")
MINDSPEED = Requirement(module="mindspeed", why="needs the mindspeed package (installed only in Ascend images; "
                                                "for the emulated lane point PARITY_MINDSPEED_SRC at a source tree)")

#: the three-way lane's baselines: the hf engine at the candidate's dtype, as torch.autocast over fp32 weights (HF
#: Trainer / Accelerate's recipe) or as low-precision weights cast from fp32 masters the optimizer steps (FSDP2's
#: MixedPrecisionPolicy, Megatron's and MindSpeed's recipe); engines/hf.py implements both
HF_REFERENCE = ReferenceRecipe(kwargs_block="engine_kwargs", baselines={
    "hf": Baseline(label="autocast", kwargs={"precision": "autocast"}),
    "hf_master_weights": Baseline(label="master_weights", kwargs={"precision": "master_weights"})})

HF = EngineSpec(
    name="hf", engine="parity.engines.hf:HFEngine",
    summary="transformers model in one process; the reference engine",
    packings=PACKINGS, checkpoints=("resume", "convert"),
    kwargs_blocks=("engine_kwargs",), loss_agg_modes=LOSS_AGG_MODES, memory=MemoryTraits(scored="response"),
    preload=("transformers", "parity.engines.hf"), source=("parity.engines.hf_common",), reference=HF_REFERENCE)

#: imported after the planned engines' preload when it holds transformers and no planned engine patches while
#: loading: transformers' modeling base and its checkpoint conversion table (engines/transformers_warm.py)
TRANSFORMERS_WARM = ("transformers.modeling_utils", "parity.engines.transformers_warm")

FSDP2 = EngineSpec(
    name="fsdp2", engine="parity.engines.fsdp2:FSDP2Engine", aliases=("fsdp",),
    summary="transformers model under torch FSDP2 fully_shard, with Ulysses sequence parallel or 2-D FSDP x TP",
    packings=PACKINGS, checkpoints=("resume", "convert"),
    dims=frozenset({"dp", "ulysses", "tp"}), kwargs_blocks=("fsdp_kwargs",),
    rules="parity.engines.specs:fsdp2_layout_errors", memory=FSDP2_MEMORY,
    preload=("transformers", "torch.distributed.fsdp", "parity.engines.fsdp2"),
    verl=VerlNames(family="fsdp", block="fsdp_config", config="FSDPEngineConfig", implied=True, default=True))

#: the Megatron engines' dist-ckpt writer against the installed torch / numpy
MEGATRON_DIST_CKPT = "parity.engines.megatron.dist_ckpt_env:dist_ckpt_problem"

MEGATRON = EngineSpec(
    name="megatron", engine="parity.engines.megatron:MegatronEngine",
    summary="Megatron-Core GPTModel with its own schedules, DDP and optimizer",
    packings=PACKINGS, checkpoints=("resume", "convert"), checkpoint_check=MEGATRON_DIST_CKPT,
    dims=MEGATRON_DIMS, kwargs_blocks=("mcore_kwargs",), layout_keys=MEGATRON_LAYOUT_KEYS,
    rules="parity.engines.megatron.rules:megatron_layout_errors", requires=(MEGATRON_CORE,), memory=MEGATRON_MEMORY,
    preload=("transformers", "megatron.core", "parity.engines.megatron.model"),
    verl=VerlNames(family="megatron", block="megatron", config="McoreEngineConfig", implied=True,
                   on_npu="mindspeed_megatron"))

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
    name="mindspeed_megatron", engine="parity.engines.mindspeed_megatron:MindSpeedMegatronEngine",
    summary="the Megatron engine with Ascend MindSpeed's adaptor re-patched for the layout",
    packings=PACKINGS, checkpoints=("resume", "convert"), checkpoint_check=MEGATRON_DIST_CKPT,
    retired={"mindspeed_llm": "verl renamed the MindSpeed-LLM strategy"},
    dims=MEGATRON_DIMS, kwargs_blocks=("mcore_kwargs",),
    layout_keys={**MEGATRON_LAYOUT_KEYS, "seq_length": "workload.prompt_len + workload.response_len"},
    rules="parity.engines.megatron.rules:megatron_layout_errors",
    requires=(TORCH_NPU, MINDSPEED, Requirement(module="mindspeed.megatron_adaptor",
                                                why="needs mindspeed.megatron_adaptor (MindSpeed Core)"),
              MEGATRON_CORE),
    environment_check="parity.engines.mindspeed_env:megatron_pairing_problem", memory=MEGATRON_MEMORY,
    devices=("npu",), preload=MINDSPEED_PRELOAD, preload_excludes=("megatron", "mindspeed"),
    verl=VerlNames(family="megatron", block="megatron", config="McoreEngineConfig"))

MINDSPEED_FSDP = EngineSpec(
    name="mindspeed_fsdp", engine="parity.engines.mindspeed_fsdp:MindSpeedFSDPEngine",
    summary="MindSpeed's FSDP parallel engine (mindspeed.fsdp) over a transformers model",
    packings=PACKINGS,
    retired={"mindspeed_mm": "MindSpeed-MM's FSDP path is MindSpeed's FSDP engine"},
    dims=frozenset({"dp", "tp", "ep", "ulysses"}), kwargs_blocks=("fsdp_kwargs",),
    requires=(TORCH_NPU, MINDSPEED, Requirement(
        module="mindspeed.fsdp.mindspeed_parallel_engine",
        why="needs a mindspeed with the mindspeed.fsdp package (MindSpeed's FSDP parallel engine; branch master "
            "or 26.1.0_core_r0.12.1)")),
    devices=("npu",), memory=FSDP_MEMORY, preload=MINDSPEED_PRELOAD, preload_excludes=("mindspeed",),
    verl=VerlNames(family="fsdp", block="fsdp_config", config="FSDPEngineConfig"))

#: the verl engines' forkserver preload: engines/verl/warm.py chooses verl's platform, then imports verl's engines
#: ("verl" itself is named last, so that a planned engine that keeps verl out of the server (verl_mindspeed) keeps
#: this whole preload out: registry.preload_modules matches top-level names)
VERL_PRELOAD = ("transformers", "torch.distributed.fsdp", "parity.engines.verl.warm", "verl")

#: the RL step verl's trainer and worker run (engines/verl/engine.py): every field of it
VERL_RL_STEP = RL_STEP_FIELDS

VERL_FSDP = EngineSpec(
    name="verl_fsdp", engine="parity.engines.verl.fsdp:VerlFSDPEngine",
    summary="verl's own FSDPEngineWithLMHead (FSDP2 / FSDP1) from verl's config, driven by verl's engine API",
    dims=frozenset({"dp", "ulysses"}), kwargs_blocks=("actor_rollout_ref",), dtypes=("fp32", "bf16"),
    loss_agg_modes=LOSS_AGG_MODES, packings=PACKINGS, checkpoints=("resume", "convert"), rl_step=VERL_RL_STEP,
    prepare="parity.engines.verl.rules:prepare_fsdp",
    rules="parity.engines.verl.rules:fsdp_errors", environment_check="parity.engines.verl.source:problem",
    # verl builds on meta except rank 0, which loads on the host; fsdp2_load_full_state_dict broadcasts
    # (verl/workers/engine/fsdp/transformer_impl.py _build_module, verl/utils/fsdp_utils.py)
    memory=MemoryTraits(sharding="fully_sharded", load="rank0_broadcast"), preload=VERL_PRELOAD)


MBRIDGE = Requirement(module="mbridge", distribution="mbridge", versions=">=0.15.1,<0.16",
                      why="mbridge is not installed (pip install mbridge==0.15.1 einops): verl's vanilla-mbridge "
                          "path builds the Megatron model")

VERL_MEGATRON = EngineSpec(
    name="verl_megatron", engine="parity.engines.verl.megatron:VerlMegatronEngine",
    summary="verl's own MegatronEngineWithLMHead (megatron-core through mbridge) from verl's config, driven by "
            "verl's engine API",
    dims=MEGATRON_DIMS, kwargs_blocks=("actor_rollout_ref",), dtypes=("bf16",), loss_agg_modes=LOSS_AGG_MODES,
    packings=PACKINGS, checkpoints=("resume",), checkpoint_check=MEGATRON_DIST_CKPT, rl_step=VERL_RL_STEP,
    prepare="parity.engines.verl.rules:prepare_megatron", rules="parity.engines.verl.rules:megatron_errors",
    memory=MEGATRON_MEMORY,
    requires=(MEGATRON_CORE, MBRIDGE), environment_check="parity.engines.verl.source:problem",
    preload=(*VERL_PRELOAD, "megatron.core", "parity.engines.verl.megatron"))

VERL_MINDSPEED = EngineSpec(
    name="verl_mindspeed", engine="parity.engines.verl.megatron:VerlMindSpeedEngine",
    summary="verl's MindspeedEngineWithLMHead (its Megatron engine with MindSpeed's repatch), Ascend NPU",
    dims=MEGATRON_DIMS, kwargs_blocks=("actor_rollout_ref",), dtypes=("bf16",), loss_agg_modes=LOSS_AGG_MODES,
    packings=PACKINGS, rl_step=VERL_RL_STEP,
    prepare="parity.engines.verl.rules:prepare_megatron", rules="parity.engines.verl.rules:megatron_errors",
    memory=MEGATRON_MEMORY,
    requires=(TORCH_NPU, MINDSPEED, Requirement(module="mindspeed.megatron_adaptor",
                                                why="needs mindspeed.megatron_adaptor (MindSpeed Core)"),
              MEGATRON_CORE, MBRIDGE),
    environment_check="parity.engines.verl.rules:mindspeed_environment_problem",
    # verl imports MindSpeed's adaptor, then Megatron (verl/workers/engine/__init__.py): the rank imports all three
    devices=("npu",), preload=MINDSPEED_PRELOAD, preload_excludes=("megatron", "mindspeed", "verl"))


def fsdp2_layout_errors(scenario: object, shape: object) -> list[tuple[str, str]]:
    """fsdp2 splits the inner mesh dimension one way: the sequence (Ulysses) or the heads (TP), not both."""
    layout = scenario.layout  # type: ignore[attr-defined]
    if layout.tp > 1 and layout.ulysses > 1:
        return [("layout.tp", f"fsdp2 takes ulysses({layout.ulysses}) or tp({layout.tp}), not both")]
    return []


BUILTIN: tuple[EngineSpec, ...] = (HF, FSDP2, MEGATRON, MINDSPEED_MEGATRON, MINDSPEED_FSDP, VERL_FSDP,
                                   VERL_MEGATRON, VERL_MINDSPEED)
