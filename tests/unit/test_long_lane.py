"""A long run's limits: the band (per-step growth of the loss / grad-norm / group checks), its calibration from clean
runs over seeds (`parity calibrate`), and the three-way lane's ratio over a window of steps. Pure functions."""

from __future__ import annotations

import math

import pytest

from parity.harness.contract.schema import Scenario, Tolerance
from parity.harness.judge.calibrate import band_proposals, distribution, seeded, step_envelopes
from parity.harness.judge.curves import STEP_RATIO_FLOOR, step_ratio_checks, windowed_ratios
from parity.harness.judge.tolerances import FP32, limits_for


def test_the_band_widens_each_step_by_its_growth():
    banded = limits_for("fp32", Tolerance(grad_norm_rel_per_step=1e-5, group_grad_norm_rel_per_step=2e-5))
    assert banded.step_tolerance("grad_norm", 1) == FP32.step_tolerance("grad_norm", 1)
    assert banded.step_tolerance("grad_norm", 41)[0] == pytest.approx(FP32.grad_norm_rel + 40 * 1e-5)
    assert banded.step_tolerance("loss", 41) == FP32.step_tolerance("loss", 41)  # no loss band given
    assert banded.group_rtol(11) == pytest.approx(FP32.group_grad_norm_rel + 10 * 2e-5)
    assert FP32.step_tolerance("grad_norm", 50) == FP32.step_tolerance("grad_norm", 1)  # short rows: no band


def _result(grad_norm_rel: list[float], dtype: str = "fp32") -> dict:
    return {"dtype": dtype, "metrics": {"grad_norm_rel": grad_norm_rel, "loss_rel": [1e-7] * len(grad_norm_rel),
                                        "group_grad_norm_rel": [None] * len(grad_norm_rel)}}


def test_the_band_covers_margin_times_every_steps_worst_clean_value():
    early_quiet = [1e-7] * 30 + [1e-4] * 10  # steps 31..40 past the base limit 5e-5
    other_seed = [2e-7] * 34 + [2e-4] + [1e-5] * 5
    envelopes = step_envelopes([_result(early_quiet), _result(other_seed)])
    assert envelopes["fp32"]["grad_norm_rel"][34] == 2e-4
    slope = band_proposals(envelopes, margin=3.0)["fp32"]["grad_norm_rel_per_step"]
    limit = [FP32.grad_norm_rel + slope * k for k in range(40)]
    assert all(limit[k] >= 3.0 * envelopes["fp32"]["grad_norm_rel"][k] - 1e-18 for k in range(40))
    assert any(math.isclose(limit[k], 3.0 * envelopes["fp32"]["grad_norm_rel"][k]) for k in range(40))  # tight
    assert band_proposals(envelopes, 3.0)["fp32"]["loss_rel_per_step"] == 0.0  # the base limit covers the loss


def test_a_non_finite_clean_value_asks_for_an_infinite_band():
    envelopes = step_envelopes([_result([1e-7, math.nan, 1e-7])])
    assert band_proposals(envelopes, 3.0)["fp32"]["grad_norm_rel_per_step"] == math.inf


def test_calibration_reports_the_worst_windowed_ratio():
    worst = distribution([{"grad_norm_rel_ratio_windowed": [None, 1.5, 3.2, 2.0]}])
    assert worst["grad_norm_rel_ratio_windowed"]["worst"] == 3.2


def test_windowed_ratios_are_ratios_of_window_medians():
    candidate = [0.01] * 9 + [1.0] + [0.02] * 10  # one noisy step does not move a median
    baseline = [0.01] * 20
    ratios = windowed_ratios(candidate, baseline, window=10)
    assert ratios[:9] == [None] * 9 and ratios[9] == pytest.approx(1.0)
    assert ratios[-1] == pytest.approx(2.0)
    tiny = windowed_ratios([2e-3] * 10, [1e-6] * 10, window=10)  # a near-exact baseline is floored
    assert tiny[-1] == pytest.approx(2e-3 / STEP_RATIO_FLOOR)
    assert windowed_ratios([math.nan] + [0.01] * 9, baseline[:10], window=10)[-1] == math.inf


def test_the_windowed_ratio_is_judged_only_where_a_scenario_asks_and_names_the_step():
    candidate, baseline = [0.01] * 12 + [0.08] * 8, [0.01] * 20
    checks, ratios = step_ratio_checks("grad_norm", candidate, baseline, limits_for("bf16", Tolerance()))
    assert checks == [] and ratios[-1] == pytest.approx(8.0)
    opted = limits_for("bf16", Tolerance(ratio_step_median=4.0))
    checks, _ = step_ratio_checks("grad_norm", candidate, baseline, opted)
    failing = [c.reason() for c in checks if not c.passed]
    assert failing[0].startswith(  # steps 8-12 at 0.01, 13-17 at 0.08: the window's median is 0.045
        "pre-clip grad norm rel diff ratio to baseline (median over 10 steps) at step 17 = 4.5 > limit 4")


def test_calibration_runs_each_clean_scenario_at_its_own_seed_and_the_others():
    """The matrix's own run is one the limits must hold for: calibrating over seeds 0..N-1 alone once missed the
    default seed's outlier of a long row."""
    plain = Scenario(model="tiny-qwen3", strategy="hf")
    at_one = Scenario(model="tiny-qwen3", strategy="hf", workload={"seed": 1}, name="one")
    faulty = Scenario(model="tiny-qwen3", strategy="hf", faults=[{"kind": "grad_scale", "factor": 2.0}])
    runs = [(s.id, s.workload.seed) for s in seeded([plain, at_one, faulty], 3)]
    assert runs == [(plain.id, 1234), (at_one.id, 1), (plain.id, 0), (at_one.id, 0), (plain.id, 1), (plain.id, 2),
                    (at_one.id, 2)]
