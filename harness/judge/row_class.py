"""Which class a low-precision row's limits come from (tolerances.limits_for): rows like those
`python benchmarks/bf16_class_limits.py` measures get their class's bar against fp32, dense or MoE, before any
update, every other row the dtype's wide bar until its own spread is measured; a row running the baseline's own code
its own step-1 limits against that baseline; a step-1 loss that is the model's own, its own loss limits."""

from __future__ import annotations

from parity.harness.config.registry import spec_for
from parity.harness.contract.parallel_dims import ParallelDims
from parity.harness.contract.schema import RL_STEP_FIELDS, Scenario, Workload


def diluted_loss(workload: Workload) -> bool:
    """Whether the step-1 loss is mostly a constant of the batch: GRPO over seeded advantages is -mean(A) before any
    update (the ratio is 1) plus a small entropy term, so rounding moves it by a small share of what it moves an
    SFT loss (the model's alone) or a group-normalised one (whose advantages' mean is 0: the harness's
    `group_normalized`, or verl's advantage estimator over seeded rewards)."""
    return workload.loss == "grpo" and workload.advantages == "seeded" and workload.adv_estimator is None


def measured_on_cpu(scenario: Scenario) -> bool:
    """On CPU, against the single-process fp32 reference, with a measured step: GRPO over seeded advantages or SFT,
    and none of verl's RL-step settings (its RL step scores old and reference log-probs again in the candidate's
    dtype). An accelerator's kernels, a model too large for the tiny ones' spread, a stored golden, group-normalised
    advantages: not measured here."""
    workload = scenario.workload
    plain = all(getattr(workload, name) == type(workload).model_fields[name].default for name in RL_STEP_FIELDS)
    measured_step = (diluted_loss(workload) or workload.loss == "sft") and plain
    return scenario.device == "cpu" and scenario.reference == "hf_fp32" and measured_step


def same_code(scenario: Scenario) -> bool:
    """Whether the row's engine computes with the baseline's own modeling code (EngineSpec.hf_modeling) on a
    data-parallel-only layout, padded: every rank runs its whole rows through the whole model, each row's arithmetic
    as in the baseline. Packed, a rank's stream holds other rows than the baseline's one stream. On CPU only, whose
    spread benchmarks/bf16_step1_spread.py shows; an accelerator's kernels may tile by the batch's shape."""
    dims = ParallelDims.of(scenario.layout)
    return (spec_for(scenario).hf_modeling and dims.world_size == dims.dp and not scenario.workload.packed
            and scenario.device == "cpu")
