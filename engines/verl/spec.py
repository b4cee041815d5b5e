"""The `verl` family's specs: verl's own engines, built from verl's config and driven through verl's engine API."""

from __future__ import annotations

from parity.engines.megatron.spec import MEGATRON_CORE, MEGATRON_DIMS, MEGATRON_DIST_CKPT, MEGATRON_MEMORY
from parity.engines.mindspeed.spec import MINDSPEED, MINDSPEED_PRELOAD, TORCH_NPU
from parity.harness.contract.schema import RL_STEP_FIELDS
from parity.harness.contract.spec import LOSS_AGG_MODES, PACKINGS, EngineSpec, MemoryTraits, Requirement

#: the verl engines' forkserver preload: engines/verl/warm.py chooses verl's platform, then imports verl's engines
#: ("verl" itself is named last, so that a planned engine that keeps verl out of the server (verl_mindspeed) keeps
#: this whole preload out: registry.preload_modules matches top-level names)
VERL_PRELOAD = ("transformers", "torch.distributed.fsdp", "parity.engines.verl.warm", "verl")

#: verl defects a row would hit on the verl that runs here (engines/verl/defects.py)
VERL_DEFECTS = "parity.engines.verl.defects:token_budget_partition"

VERL_FSDP = EngineSpec(
    name="verl_fsdp", engine="parity.engines.verl.fsdp:VerlFSDPEngine",
    summary="verl's own FSDPEngineWithLMHead (FSDP2 / FSDP1) from verl's config, driven by verl's engine API",
    dims=frozenset({"dp", "ulysses"}), kwargs_blocks=("actor_rollout_ref",), dtypes=("fp32", "bf16"),
    loss_agg_modes=LOSS_AGG_MODES, packings=PACKINGS, checkpoints=("resume", "convert"), rl_step=RL_STEP_FIELDS,
    prepare="parity.engines.verl.rules:prepare_fsdp",
    rules="parity.engines.verl.rules:fsdp_errors", environment_check="parity.engines.verl.source:problem",
    upstream_defects=VERL_DEFECTS,
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
    packings=PACKINGS, checkpoints=("resume",), checkpoint_check=MEGATRON_DIST_CKPT, rl_step=RL_STEP_FIELDS,
    prepare="parity.engines.verl.rules:prepare_megatron", rules="parity.engines.verl.rules:megatron_errors",
    memory=MEGATRON_MEMORY,
    requires=(MEGATRON_CORE, MBRIDGE), environment_check="parity.engines.verl.source:problem",
    upstream_defects=VERL_DEFECTS,
    preload=(*VERL_PRELOAD, "megatron.core", "parity.engines.verl.megatron"))

VERL_MINDSPEED = EngineSpec(
    name="verl_mindspeed", engine="parity.engines.verl.megatron:VerlMindSpeedEngine",
    summary="verl's MindspeedEngineWithLMHead (its Megatron engine with MindSpeed's repatch), Ascend NPU",
    dims=MEGATRON_DIMS, kwargs_blocks=("actor_rollout_ref",), dtypes=("bf16",), loss_agg_modes=LOSS_AGG_MODES,
    packings=PACKINGS, rl_step=RL_STEP_FIELDS,
    prepare="parity.engines.verl.rules:prepare_megatron", rules="parity.engines.verl.rules:megatron_errors",
    memory=MEGATRON_MEMORY,
    requires=(TORCH_NPU, MINDSPEED, Requirement(module="mindspeed.megatron_adaptor",
                                                why="needs mindspeed.megatron_adaptor (MindSpeed Core)"),
              MEGATRON_CORE, MBRIDGE),
    environment_check="parity.engines.verl.rules:mindspeed_environment_problem",
    # verl imports MindSpeed's adaptor, then Megatron (verl/workers/engine/__init__.py): the rank imports all three
    devices=("npu",), preload=MINDSPEED_PRELOAD, preload_excludes=("megatron", "mindspeed", "verl"))
