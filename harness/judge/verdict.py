"""Turn a candidate RunRecord and its reference (and optional baseline) into a Verdict.

All checks are collected before the verdict (Megatron-LM's tolerance objects do the same), and every
failing check is a reason that names the metric, the step, the observed value and the limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from parity.harness.config.models import model_shape
from parity.harness.contract.schema import Scenario
from parity.harness.contract.spec import KWARGS_BLOCKS
from parity.harness.judge.baseline_step1 import baseline_step1_checks
from parity.harness.judge.causal import causal_reasons
from parity.harness.judge.checkpoint import conversion_checks, resume_checks
from parity.harness.judge.checks import Check
from parity.harness.judge.compare import TokenDiff, error_ratio, rel_limit, series_rel_diff, token_diff
from parity.harness.judge.curves import step_ratio_checks
from parity.harness.judge.distribution import histograms
from parity.harness.judge.fingerprint import first_divergent
from parity.harness.judge.groups import group_checks, group_sum_checks, worst_group_rel_per_step
from parity.harness.judge.loads import expert_load_checks
from parity.harness.judge.perf import perf_metrics, reference_perf, step_series, versus_reference
from parity.harness.judge.row_class import diluted_loss, measured_on_cpu, same_code
from parity.harness.judge.schedule import lr_checks, schedule_series
from parity.harness.judge.tolerances import LAG_CAP, RATIO_FLOOR_ABS, Limits, limits_for
from parity.harness.run.records import RunRecord

Status = Literal["PASS", "FAIL", "ERROR", "SKIP"]
PHASES = {"logprobs_before": "log-prob before training", "logprobs_after": "log-prob after the last step",
          "entropy_before": "entropy before training", "entropy_after": "entropy after the last step"}


@dataclass(slots=True)
class Verdict:
    id: str
    status: Status
    reasons: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    """strategy, layout, dtype, device, reference, baseline, source file, timings."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "verdict": self.status, "reasons": self.reasons, "metrics": self.metrics,
                "checks": [asdict(c) | {"passed": c.passed} for c in self.checks], **self.info}


def scenario_info(scenario: Scenario) -> dict[str, Any]:
    return {"strategy": scenario.engine_label, "layout": scenario.layout.tag(), "dtype": scenario.dtype,
            "device": scenario.device, "reference": scenario.reference, "baseline": scenario.baseline,
            "source": scenario.source, "marks": list(scenario.marks), "name": scenario.name,
            "packing": scenario.workload.packing,
            "faults": [fault.kind for fault in scenario.faults]}


def skipped(scenario: Scenario, reason: str) -> Verdict:
    return Verdict(scenario.id, "SKIP", [reason], info=scenario_info(scenario))


def errored(scenario: Scenario, record: RunRecord, what: str = "candidate") -> Verdict:
    reason = f"{what} run {record.status}: {record.error}"
    verdict = Verdict(scenario.id, "ERROR", [reason], info=scenario_info(scenario))
    verdict.info["log_tail"] = record.log_tail
    return verdict


def failed(scenario: Scenario, stage: str, exc: BaseException) -> Verdict:
    """ERROR for an exception raised while running, comparing or reporting this scenario."""
    return Verdict(scenario.id, "ERROR", [f"error while {stage}: {type(exc).__name__}: {exc}"],
                   info=scenario_info(scenario))


def judge(scenario: Scenario, candidate: RunRecord, reference: RunRecord,
          baseline: RunRecord | None = None, repeats: Sequence[RunRecord] = (),
          uninterrupted: RunRecord | None = None) -> Verdict:
    """`uninterrupted`: for a `resume` scenario, the same engine's run without the checkpoint in between."""
    shape = model_shape(scenario.model)
    limits = limits_for(scenario.dtype, scenario.tolerance, moe=bool(shape and shape.num_experts),
                        same_code=same_code(scenario), measured=measured_on_cpu(scenario),
                        own_loss=not diluted_loss(scenario.workload))
    if baseline is not None and (problem := baseline_problem(baseline, reference)):
        return Verdict(scenario.id, "ERROR", [f"baseline {scenario.baseline} ({baseline.run_id}) is unusable as a "
                                              f"bar: {problem}"], info=scenario_info(scenario))
    checks, metrics = _candidate_checks(candidate, reference, limits, baseline)
    if baseline is not None:
        checks += baseline_step1_checks(candidate, baseline, limits)
    group, metrics["group_grad_norm_rel_max"] = group_checks(candidate, reference, limits)
    metrics["group_grad_norm_rel"] = worst_group_rel_per_step(candidate, reference)
    checks += group + group_sum_checks(candidate, limits) + expert_load_checks(candidate, reference, limits)
    checks += lr_checks(candidate, scenario.workload, limits)
    if scenario.resume is not None and uninterrupted is not None:
        checks += resume_checks(candidate, uninterrupted, limits, scenario.resume_exact, scenario.resume.after + 1)
    if scenario.convert:
        checks += conversion_checks(candidate, limits)
    reasons = causal_reasons(checks, scenario.workload.steps, per_module=group)
    reasons += [f"reference {c.reason()}" for c in lr_checks(reference, scenario.workload, limits)
                if not c.passed]
    updates = scenario.workload.steps * scenario.workload.updates_per_step
    if (taken := candidate.optimizer_steps) is not None and taken != updates:
        per_step = f" ({scenario.workload.updates_per_step} per step)" if updates != scenario.workload.steps else ""
        reasons.append(f"optimizer took {taken} step{'s' * (taken != 1)}, workload has {updates}{per_step} "
                       "(Engine.optimizer_steps read back from the optimizer state)")
    if dropped := dropped_kwargs(scenario, candidate):
        reasons.append(f"dropped engine kwargs: {', '.join(dropped)} (accepted but never applied by the engine)")
    if differing := kwargs_not_as_given(scenario, candidate):
        reasons.append(f"engine kwargs not applied as given: {'; '.join(differing)}")
    absolute_lane = baseline is None and scenario.reference == "hf_fp32"
    reasons += precision_problems(scenario.dtype, candidate, metrics, limits, absolute_lane,
                                  against_fp32=reference.effective_dtype in (None, "fp32"))
    reasons += [f"not deterministic: {problem}" for problem in determinism_problems(candidate, repeats)]
    metrics |= perf_metrics(candidate, scenario.dtype, scenario.layout.world_size)
    if scenario.reference.startswith("golden:"):  # a stored run on the reference device: speed side by side
        metrics["vs_reference"] = versus_reference(metrics, reference_perf(reference))
    metrics |= {"wall_time_s": candidate.wall_time_s, "compute_time_s": candidate.compute_time_s,
                "applied_kwargs": candidate.applied_kwargs,
                "series": step_series(candidate, reference) | schedule_series(candidate, scenario.workload),
                "logprob_abs_hist": histograms(candidate.tensors, reference.tensors)}
    if (where := first_divergent(candidate.fingerprint, reference.fingerprint, scenario.dtype)) is not None:
        metrics["first_divergent"] = where.to_json()
    info = scenario_info(scenario) | {"provenance": candidate.provenance}
    return Verdict(scenario.id, "FAIL" if reasons else "PASS", reasons, metrics, checks, info)


def _candidate_checks(candidate: RunRecord, reference: RunRecord, limits: Limits,
                      baseline: RunRecord | None) -> tuple[list[Check], dict[str, Any]]:
    """The absolute checks always (in the three-way lane too: a candidate must stay within what its precision
    can reach, however bad the baseline), plus the ratio checks when a baseline is given."""
    mask = reference.tensors["response_mask"]
    checks: list[Check] = []
    metrics: dict[str, Any] = {}
    for key, label in PHASES.items():
        diff = token_diff(candidate.tensors[key], reference.tensors[key], mask)
        metrics[key] = asdict(diff)
        updated = key.endswith("_after")
        checks += [Check(f"{label} max |Δ|", diff.max_abs, limits.token_limit("logprob_max_abs", updated)),
                   Check(f"{label} mean |Δ|", diff.mean_abs, limits.token_limit("logprob_mean_abs", updated))]
        if key.startswith("logprobs"):
            checks += [Check(f"{label} p99 |Δ|", diff.p99_abs, limits.token_limit("logprob_p99_abs", updated)),
                       Check(f"{label} KL k3", diff.kl_k3, limits.token_limit("kl_k3", updated))]
        if baseline is not None:
            base = token_diff(baseline.tensors[key], reference.tensors[key], mask)
            metrics[key]["baseline"] = asdict(base)
            ratios = error_ratios(diff, base)
            metrics[key] |= {f"ratio_{stat}": ratio for stat, ratio in ratios.items()}
            checks += [Check(f"{label} {stat} |Δ| ratio to baseline", ratio, limit, lane="ratio")
                       for stat, ratio in ratios.items() if (limit := getattr(limits, f"ratio_{stat}")) is not None]
    for name in ("loss", "grad_norm"):
        ref_series = [getattr(s, name) for s in reference.steps]
        series = series_rel_diff([getattr(s, name) for s in candidate.steps], ref_series)
        metrics[f"{name}_rel"] = list(series.per_step)
        metrics[f"{name}_rel_max"] = series.worst
        label = "pre-clip grad norm" if name == "grad_norm" else name
        step_limits = []
        for i, value in enumerate(series.per_step):
            ref = ref_series[i] if i < len(ref_series) else math.nan
            # the i+1-th optimizer update: the first is before any update, the rest after (a step's later updates
            # included), so the step-1 limits apply to it alone
            rtol, atol = limits.step_tolerance(name, i + 1)
            bar = rtol * abs(ref) + atol
            lag = min(baseline_lag(baseline, name, i, ref), LAG_CAP * bar) if math.isfinite(bar) else 0.0
            step_limits.append(rel_limit(rtol, atol + lag, ref))
            step, update = update_at(reference, candidate, i)
            how = f"rtol {rtol:.3g} + atol {atol:.3g}/|ref {ref:.3g}|" if atol else ""
            how += f" + the baseline's own |Δ| {lag:.3g}/|ref|" if lag else ""
            checks.append(Check(f"{label} rel diff", value, step_limits[-1], step=step, update=update, lane="rel",
                                note=how))
        metrics[f"{name}_rel_limit"] = step_limits
        if baseline is not None:  # one step's error is one draw: judged only as medians over windows, opt-in
            base_series = list(series_rel_diff([getattr(s, name) for s in baseline.steps], ref_series).per_step)
            metrics[f"{name}_rel_baseline"] = base_series
            windowed, metrics[f"{name}_rel_ratio_windowed"] = step_ratio_checks(name, list(series.per_step),
                                                                                base_series, limits)
            checks += windowed
    metrics["logprob_max_abs"] = worst(metrics[k]["max_abs"] for k in ("logprobs_before", "logprobs_after"))
    metrics["logprob_mean_abs"] = worst(metrics[k]["mean_abs"] for k in ("logprobs_before", "logprobs_after"))
    return checks, metrics


def baseline_lag(baseline: RunRecord | None, name: str, index: int, reference: float) -> float:
    """After the first update, how far the same-recipe baseline's `name` (loss / grad_norm) is from the fp32
    reference's at that update: the recipe's own lag, which the candidate may show as well on top of the dtype's bar.
    A low-precision model whose weights start on the dtype's grid (a checkpoint saved in bf16) rounds away an Adam
    update smaller than half a unit in the last place, where fp32 takes it, and the candidate and the baseline lag
    alike (benchmarks/MEASUREMENTS.md has the rows). 0 before any update, without a baseline, or where it has no
    such update."""
    if index == 0 or baseline is None or index >= len(baseline.steps):
        return 0.0
    lag = abs(getattr(baseline.steps[index], name) - reference)
    return lag if math.isfinite(lag) else 0.0


def update_at(reference: RunRecord, candidate: RunRecord, index: int) -> tuple[int, int | None]:
    """(step, update) of the index-th record (the reference's, else the candidate's); update None where every step
    took one."""
    records = reference.steps if index < len(reference.steps) else candidate.steps
    if index >= len(records):
        return index + 1, None
    several = any(s.update > 1 for s in (*reference.steps, *candidate.steps))
    return records[index].step, records[index].update if several else None


def worst(values: Iterable[float]) -> float:
    """The largest value, NaN when any is NaN (`max(0.0, nan)` is 0.0: a NaN after the steps showed as 0)."""
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values)


#: token statistics the three-way lane can judge as candidate-error / baseline-error, and their Limits fields
RATIO_STATS = ("median", "mean", "max")


def error_ratios(diff: TokenDiff, base: TokenDiff) -> dict[str, float]:
    """Candidate-error / baseline-error per statistic in RATIO_STATS (a Limits field `ratio_<stat>` set to None
    leaves that one unjudged)."""
    return {stat: error_ratio(getattr(diff, f"{stat}_abs"), getattr(base, f"{stat}_abs"), RATIO_FLOOR_ABS)
            for stat in RATIO_STATS}


def baseline_problem(baseline: RunRecord, reference: RunRecord) -> str | None:
    """Why a three-way baseline cannot serve as a bar (non-finite log-probs, entropy, loss or grad norm, or
    missing steps); None when it can. A broken bar must ERROR, never let a candidate through."""
    mask = reference.tensors["response_mask"].bool()
    for key, label in PHASES.items():
        values = baseline.tensors.get(key)
        if values is None:
            return f"no {label}"
        if not bool(values[mask].isfinite().all()):
            return f"{label} not finite"
    if len(baseline.steps) != len(reference.steps):
        return f"{len(baseline.steps)} steps, the reference has {len(reference.steps)}"
    for step in baseline.steps:
        for name in ("loss", "grad_norm"):
            if not math.isfinite(getattr(step, name)):
                return f"{name} at step {step.step} = {getattr(step, name)}"
    return None


def precision_problems(dtype: str, candidate: RunRecord, metrics: dict[str, Any], limits: Limits,
                       absolute_lane: bool = False, against_fp32: bool = True) -> list[str]:
    """A low-precision scenario silently computed in fp32 would PASS every upper bound: the engine's own report
    of its compute dtype must match, and its forward must be at least as far from fp32 as that precision gets.
    The distance is a lower bound only where the reference computed in fp32: against a golden that ran in the same
    low precision (a stored bf16 run), agreeing to the last bit is the best outcome, not a sign of fp32."""
    problems = []
    if candidate.effective_dtype is not None and candidate.effective_dtype != dtype:
        problems.append(f"computed in {candidate.effective_dtype}, the scenario asks for {dtype} "
                        "(Engine.effective_dtype read back from the engine)")
    problems += _fp32_distance_problems(dtype, metrics, limits, absolute_lane) if against_fp32 else []
    if limits.ratio_median_min is not None:
        for key, label in PHASES.items():
            ratio = (metrics.get(key) or {}).get("ratio_median")
            if ratio is not None and not ratio >= limits.ratio_median_min:
                problems.append(f"not computed in {dtype}: {label} median |Δ| is {ratio:.3g}x the {dtype} baseline's "
                                f"(< {limits.ratio_median_min:.3g}, lower bound): nearer fp32 than {dtype} arithmetic "
                                "gets")
    return problems


def _fp32_distance_problems(dtype: str, metrics: dict[str, Any], limits: Limits, absolute_lane: bool) -> list[str]:
    """The forward's distance from an fp32 reference, bounded below: a low-precision forward is never that close."""
    problems = []
    observed = metrics["logprobs_before"]["max_abs"]
    if limits.logprob_max_abs_min and observed < limits.logprob_max_abs_min:
        problems.append(f"not computed in {dtype}: log-prob before training max |Δ| vs fp32 = {observed:.3g} < "
                        f"{limits.logprob_max_abs_min:.3g}, the least a {dtype} forward differs by (lower bound)")
    entropy = metrics["entropy_before"]["max_abs"]
    if limits.entropy_max_abs_min and not entropy >= limits.entropy_max_abs_min:
        problems.append(f"not computed in {dtype}: entropy before training max |Δ| vs fp32 = {entropy:.3g} < "
                        f"{limits.entropy_max_abs_min:.3g}, the least a {dtype} forward differs by (lower bound)")
    median = metrics["entropy_before"]["median_abs"]
    if absolute_lane and limits.entropy_median_abs_max is not None and not median <= limits.entropy_median_abs_max:
        problems.append(f"not computed in {dtype}: entropy before training median |Δ| vs fp32 = {median:.3g} > "
                        f"{limits.entropy_median_abs_max:.3g}: the error of rounding it to {dtype}, not of {dtype} "
                        "arithmetic (outputs computed in fp32 and rounded?)")
    return problems


def determinism_problems(first: RunRecord, repeats: Sequence[RunRecord]) -> list[str]:
    """Where a repeat of the same run differs from the first, bit for bit (NaN equals NaN here)."""
    problems = []
    for index, again in enumerate(repeats, start=2):
        for key in PHASES:
            a, b = first.tensors[key], again.tensors[key]
            if not torch.equal(a.nan_to_num(), b.nan_to_num()) or not torch.equal(a.isnan(), b.isnan()):
                delta = float((a.double() - b.double()).abs().nan_to_num().max())
                problems.append(f"run {index} {PHASES[key]} differs from run 1 (max |Δ| {delta:.3g})")
        for name in ("loss", "grad_norm"):
            ours, theirs = [getattr(s, name) for s in first.steps], [getattr(s, name) for s in again.steps]
            if ours != theirs and not all(math.isnan(x) and math.isnan(y) for x, y in zip(ours, theirs, strict=False)):
                step = next((i + 1 for i, (x, y) in enumerate(zip(ours, theirs, strict=False)) if x != y), None)
                label = "pre-clip grad norm" if name == "grad_norm" else name
                problems.append(f"run {index} {label} differs from run 1 at step {step}")
    return problems


def dropped_kwargs(scenario: Scenario, record: RunRecord) -> list[str]:
    """Keys given in a kwargs block that the engine did not report as applied."""
    dropped = []
    for block in KWARGS_BLOCKS:
        applied = record.applied_kwargs.get(block, {})
        dropped += [f"{block}.{key}" for key in getattr(scenario, block) if key not in applied]
    return dropped


def kwargs_not_as_given(scenario: Scenario, record: RunRecord) -> list[str]:
    """Keys the engine reports with an effective value other than the one requested."""
    differing = []
    for block in KWARGS_BLOCKS:
        applied = record.applied_kwargs.get(block, {})
        for key, requested in getattr(scenario, block).items():
            if key in applied and applied[key] != requested and str(applied[key]) != str(requested):
                differing.append(f"{block}.{key} requested {requested!r}, effective {applied[key]!r}")
    return differing

