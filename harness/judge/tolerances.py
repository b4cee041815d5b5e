"""Default limits per dtype and lane: one list of limits (the scenario schema's Tolerance) with a value per lane.
The measurements behind each number are in docs/tolerances.md."""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from parity.harness.contract.schema import Tolerance


class Limits(Tolerance):
    """A dtype lane's limits: every Tolerance field (the one list of limits a scenario's `tolerance:` may set; None
    = that check is not made) and the lower bounds that prove a run computed in its dtype, which a scenario does
    not set. Deriving from Tolerance keeps the two lists one: a limit added there is a limit here."""

    ALWAYS: ClassVar[tuple[str, ...]] = ("logprob_max_abs", "logprob_mean_abs", "logprob_p99_abs", "kl_k3",
                                         "loss_rel", "grad_norm_rel", "loss_atol", "grad_norm_atol", "ratio_median",
                                         "group_grad_norm_atol", "loss_rel_per_step", "grad_norm_rel_per_step",
                                         "group_grad_norm_rel_per_step", "ratio_step_window", "lr_rel", "group_sum_rel")
    """The limits every judgement uses: a lane must set them."""

    logprob_max_abs_min: float = 0.0
    """LOWER bound on the before-training log-prob max |Δ| vs fp32: below it the engine did not compute in this
    dtype (0 = no bound)."""
    entropy_max_abs_min: float = 0.0
    """LOWER bound on the before-training entropy max |Δ| vs fp32: an engine that computed in fp32 and rounded
    only its log-probs (which then clear logprob_max_abs_min) left its entropy fp32-exact (0 = no bound)."""
    entropy_median_abs_max: float | None = None
    """Absolute lane against the fp32 reference only (no baseline): upper bound on the before-training entropy
    median |Δ|. Entropy rounded to this dtype moves by about a quarter of an ulp, arithmetic in it by far less
    (the three-way lane sees the same through the ratio)."""
    ratio_median_min: float | None = None
    """Three-way lane: LOWER bound on candidate-error / baseline-error (median |Δ|) of log-probs and entropy. An
    output computed in fp32 and left unrounded is far closer to fp32 than the low-precision baseline; rounded to
    the dtype it is too far (past ratio_median)."""

    @model_validator(mode="after")
    def _complete(self) -> Limits:
        if unset := [name for name in self.ALWAYS if getattr(self, name) is None]:
            raise ValueError(f"a lane's limits must set {', '.join(unset)}")
        return self

    def step_tolerance(self, name: str, step: int) -> tuple[float, float]:
        """(rtol, atol) of the per-step `loss` or `grad_norm` check at `step` (1-based)."""
        rtol, atol = getattr(self, f"{name}_rel"), getattr(self, f"{name}_atol")
        if step > 1:
            rtol = _given(getattr(self, f"{name}_rel_updated"), rtol)
            atol = _given(getattr(self, f"{name}_atol_updated"), atol)
        return rtol + getattr(self, f"{name}_rel_per_step") * (step - 1), atol

    def token_limit(self, name: str, updated: bool) -> float:
        """The limit `name` (logprob_max_abs, logprob_mean_abs, logprob_p99_abs, kl_k3) before training, or after
        the optimizer's updates (its `_updated` twin where set)."""
        return _given(getattr(self, f"{name}_updated"), getattr(self, name)) if updated else getattr(self, name)

    def group_rtol(self, step: int) -> float | None:
        """rtol of the per-module grad norm check at `step` (None: groups not compared in this dtype)."""
        if self.group_grad_norm_rel is None:
            return None
        return self.group_grad_norm_rel + self.group_grad_norm_rel_per_step * (step - 1)


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


# Why each number is what it is (the clean runs and injected faults each sits between, over how many seeds and
# rows) is in docs/tolerances.md, measured by benchmarks/seed_scan.py, rejudge.py and margins.py.
_LONG_RUN = {"loss_rel_per_step": 0.0, "grad_norm_rel_per_step": 0.0, "group_grad_norm_rel_per_step": 0.0,
             "ratio_step_window": 10, "lr_rel": 1e-6, "group_sum_rel": 1e-5}
"""Every lane: no band (a scenario's long rows set theirs, calibrated: docs/tolerances.md), ratio windows of 10
steps, the schedule followed to double precision (schedulers compute the lr in Python floats), and an engine's grad
norm equal to its modules' root-sum-square to fp32 summation order (both read from the same fp32 gradients; a
low-precision lane allows more where not measured: LOW_PRECISION_GROUP_SUM)."""
#: a low-precision row's `group_sum_rel` where not measured (MEASURED_ON_CPU): an engine may take its norm from
#: gradients held in the dtype, as torch's clip_grad_norm_ does, each per-tensor norm and their total rounded to it
#: (two unit roundoffs of bf16: 2 x 2^-9)
LOW_PRECISION_GROUP_SUM = 4e-3
GROUP_RTOL_FP32 = 1e-4
"""rtol of the per-group pre-clip grad norm check in fp32 (not compared in low precision)."""
FP32 = Limits(logprob_max_abs=5e-5, logprob_mean_abs=5e-6, logprob_p99_abs=2e-5, kl_k3=1e-9,
              loss_rel=2e-5, grad_norm_rel=5e-5, loss_atol=1e-6, grad_norm_atol=1e-6, ratio_median=3.0,
              group_grad_norm_rel=GROUP_RTOL_FP32, group_grad_norm_atol=1e-6, **_LONG_RUN)
"""fp32 candidate vs the fp32 reference on CPU. The loss atol: a GRPO step-1 loss is a sum of +-advantage terms
that can cancel to almost nothing, and its fp32 error is absolute, so a purely relative check would fail clean
runs."""
LOW_PRECISION = Limits(logprob_max_abs=1.5, logprob_mean_abs=0.12, logprob_p99_abs=1.0, kl_k3=0.02,
                       loss_rel=2e-2, grad_norm_rel=0.1, loss_atol=2e-3, grad_norm_atol=2e-3, ratio_median=4.0,
                       logprob_max_abs_updated=1.5, logprob_mean_abs_updated=0.12, logprob_p99_abs_updated=1.0,
                       kl_k3_updated=0.02, loss_rel_updated=0.2, loss_atol_updated=1e-2, grad_norm_rel_updated=0.5,
                       group_grad_norm_atol=1e-6, **(_LONG_RUN | {"group_sum_rel": LOW_PRECISION_GROUP_SUM}))
"""bf16 / fp16 candidate vs the fp32 reference: the absolute bar, in the three-way lane too (whose sensitive check
is the median ratio), for a row of no measured class (MEASURED_ON_CPU). After the first update the weights carry the
dtype's rounding of it, so the log-probs after training and steps >= 2 have their own limits (`*_updated`), kept in
every class: that spread grows with the steps and the learning rate."""
DEFAULTS = {"fp32": FP32,
            "bf16": LOW_PRECISION.model_copy(update={"logprob_max_abs_min": 1e-3, "entropy_max_abs_min": 5e-5,
                                                     "entropy_median_abs_max": 2e-3, "ratio_median_min": 0.1,
                                                     "loss_rel_baseline_step1": 2e-4,
                                                     "grad_norm_rel_baseline_step1": 9.5e-3,
                                                     "group_grad_norm_rel_baseline_step1": 0.06,
                                                     "common_grad_scale_baseline_step1": 6e-3}),
            "fp16": LOW_PRECISION.model_copy(update={"logprob_max_abs_min": 1.25e-4, "entropy_max_abs_min": 6.25e-6,
                                                     "entropy_median_abs_max": 2.5e-4, "ratio_median_min": 0.1,
                                                     "group_sum_rel": LOW_PRECISION_GROUP_SUM / 8})}
"""Per dtype. The lower bounds prove the run computed in its dtype (what rounding the outputs alone cannot fake:
docs/tolerances.md); fp16's are bf16's over its 8x smaller unit roundoff. bf16's step-1 checks against the
same-recipe baseline are set per row class (MOE_UPDATES, SAME_CODE_UPDATES) over the worst clean spread of the
class, as `python benchmarks/bf16_step1_spread.py` prints it (docs/tolerances.md, Margins)."""
MOE_UPDATES = {"bf16": {"grad_norm_rel_baseline_step1": 0.0105, "group_grad_norm_rel_baseline_step1": 0.33,
                        "common_grad_scale_baseline_step1": 0.016}}
"""Per dtype, a MoE row's limits where they differ from a dense row's: the router's bf16 top-k flips a token's
experts between the two implementations, so MoE gradients spread wider than dense ones, the scale every module
shares too (a flipped token's gradient reaches every layer below it), the more so the fewer the tokens."""
SAME_CODE_UPDATES = {"bf16": {"loss_rel_baseline_step1": 1e-5, "grad_norm_rel_baseline_step1": 5e-4,
                              "group_grad_norm_rel_baseline_step1": 0.01, "common_grad_scale_baseline_step1": 2.5e-4}}
"""Per dtype, the step-1 baseline limits of a row whose engine computes with the baseline's own modeling code on a
data-parallel-only layout (EngineSpec.hf_modeling), dense or MoE alike: the same forward routes every token alike,
and the gradients differ by reduction order alone (row_class.same_code says which rows)."""

MEASURED_ON_CPU = {"bf16": {
    "dense": {"logprob_max_abs": 0.11, "logprob_mean_abs": 0.021, "logprob_p99_abs": 0.085, "kl_k3": 1.2e-4,
              "loss_rel": 2e-4, "loss_atol": 2e-5, "grad_norm_rel": 0.014, "group_sum_rel": 1e-5},
    "MoE": {"loss_rel": 2e-4, "loss_atol": 2e-5, "grad_norm_rel": 0.05, "group_sum_rel": 1e-5}}}
"""Per dtype and row class, the bar against the fp32 reference before any update (the log-probs before training,
step 1's loss and pre-clip grad norm) of a row row_class.measured_on_cpu says was measured: about 3x the worst clean
value of `python benchmarks/bf16_class_limits.py` over its seed scans. A MoE row's log-probs keep the wide bar: a
router's bf16 top-k flips put single tokens far off. The loss limits are a diluted step-1 loss's (OWN_LOSS). Every
engine here takes its norm from fp32 gradients, which its modules' norms match to summation order (`group_sum_rel`)."""
OWN_LOSS = {"bf16": {"dense": {"loss_rel": 1e-3, "loss_rel_baseline_step1": 7e-4},
                     "MoE": {"loss_rel": 6.5e-3, "loss_rel_baseline_step1": 1.7e-3}}}
"""Per dtype and row class, the step-1 loss limits where the loss is the model's own (row_class.diluted_loss is
False: SFT, group-normalised advantages), whose rounding a GRPO loss's constant -mean(A) does not dilute: against the
same-recipe baseline on every row, against fp32 (`loss_rel`) on a measured row only. The same-code class keeps its
own baseline limit (the same code rounds alike whatever the loss)."""

#: the most a baseline's lag widens the bar after an update, in units of the bar: a candidate may lag as far as its
#: same-recipe baseline does, but a baseline far off by a defect of its own must not carry a candidate with it
LAG_CAP = 2.0

#: below this, a baseline's log-prob / entropy error counts as this much (a near-exact baseline must not turn
#: noise into a huge ratio).
RATIO_FLOOR_ABS = 1e-4


def limits_for(dtype: str, override: Tolerance, moe: bool = False, same_code: bool = False,
               measured: bool = False, own_loss: bool = False) -> Limits:
    """The dtype's limits (a MoE row's, a CPU class's of MEASURED_ON_CPU, a row's whose step-1 loss is the model's
    own, a same-code row's, where they differ) with the scenario's `tolerance:` overrides (its fields that are
    set)."""
    klass = "MoE" if moe else "dense"
    lane = DEFAULTS[dtype].model_copy(update=MOE_UPDATES.get(dtype, {}) if moe else {})
    if measured:
        lane = lane.model_copy(update=MEASURED_ON_CPU.get(dtype, {}).get(klass, {}))
    if own_loss:
        lane = lane.model_copy(update={name: value for name, value in OWN_LOSS.get(dtype, {}).get(klass, {}).items()
                                       if measured or name.endswith("_baseline_step1")})
    lane = lane.model_copy(update=SAME_CODE_UPDATES.get(dtype, {}) if same_code else {})
    return lane.model_copy(update=override.model_dump(exclude_none=True))
