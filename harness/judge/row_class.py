"""Which measured class a low-precision row's bar against the fp32 reference comes from (tolerances.limits_for):
rows like those `python benchmarks/bf16_class_limits.py` measures get their class's limits, dense or MoE, before
any update; every other row keeps the dtype's wide bar until its own spread is measured."""

from __future__ import annotations

from parity.harness.contract.schema import RL_STEP_FIELDS, Scenario


def measured_on_cpu(scenario: Scenario) -> bool:
    """On CPU, against the single-process fp32 reference, with the measured step: GRPO over seeded advantages and
    none of verl's RL-step settings. Its step-1 loss is mostly the advantages' mean, which no rounding moves; an SFT
    loss is the model's alone and moves by its whole rounding, and verl's RL step scores old and reference
    log-probs again in the candidate's dtype. An accelerator's kernels, a model too large for the tiny ones' spread,
    a stored golden: not measured here."""
    workload = scenario.workload
    plain = all(getattr(workload, name) == type(workload).model_fields[name].default for name in RL_STEP_FIELDS)
    measured_step = workload.loss == "grpo" and workload.advantages == "seeded" and plain
    return scenario.device == "cpu" and scenario.reference == "hf_fp32" and measured_step
