"""The `hf` family's spec: the reference engine, and the baselines of the three-way lane."""

from __future__ import annotations

from parity.harness.contract.schema import RL_STEP_FIELDS
from parity.harness.contract.spec import LOSS_AGG_MODES, PACKINGS, Baseline, EngineSpec, MemoryTraits, ReferenceRecipe

#: the three-way lane's baselines: the hf engine at the candidate's dtype, as torch.autocast over fp32 weights (HF
#: Trainer / Accelerate's recipe) or as low-precision weights cast from fp32 masters the optimizer steps (FSDP2's
#: MixedPrecisionPolicy, Megatron's and MindSpeed's recipe); engines/hf/engine.py implements both
HF_REFERENCE = ReferenceRecipe(kwargs_block="engine_kwargs", baselines={
    "hf": Baseline(label="autocast", kwargs={"precision": "autocast"}),
    "hf_master_weights": Baseline(label="master_weights", kwargs={"precision": "master_weights"})})

HF = EngineSpec(
    name="hf", engine="parity.engines.hf.engine:HFEngine",
    summary="transformers model in one process; the reference engine",
    packings=PACKINGS, checkpoints=("resume", "convert"),
    kwargs_blocks=("engine_kwargs",), loss_agg_modes=LOSS_AGG_MODES, memory=MemoryTraits(scored="response"),
    preload=("transformers", "parity.engines.hf.engine"), source=("parity.engines.hf.common", "parity.reference"),
    reference=HF_REFERENCE, rl_step=RL_STEP_FIELDS, rules="parity.engines.hf.rules:hf_errors", hf_modeling=True)

#: imported after the planned engines' preload when it holds transformers and no planned engine patches while
#: loading: transformers' modeling base and its checkpoint conversion table (engines/transformers_warm.py)
TRANSFORMERS_WARM = ("transformers.modeling_utils", "parity.engines.transformers_warm")
