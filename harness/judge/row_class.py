"""Which measured class a low-precision row's bar against the fp32 reference comes from (tolerances.limits_for):
rows like those `python benchmarks/bf16_class_limits.py` measures get their class's limits, dense or MoE, before
any update; every other row keeps the dtype's wide bar until its own spread is measured."""

from __future__ import annotations

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
