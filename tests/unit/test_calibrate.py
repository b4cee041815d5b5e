"""Calibration statistics: worst (NaN is the worst), p90, median, and limits proposed as worst x margin."""

from __future__ import annotations

import math

import pytest

from parity.harness.judge.calibrate import distribution, proposals

pytestmark = pytest.mark.torch_free


def test_distribution_and_proposals():
    runs = [{"loss_rel_max": v, "logprob_max_abs": 1e-6} for v in (1e-7, 3e-7, 2e-7)]
    dist = distribution(runs)
    assert dist["loss_rel"] == {"runs": 3, "worst": 3e-7, "median": 2e-7, "p90": 3e-7}
    assert proposals(dist, 10)["loss_rel"] == 3e-6
    assert "kl_k3" not in dist  # never measured: no proposal
    assert math.isinf(distribution([*runs, {"loss_rel_max": math.nan}])["loss_rel"]["worst"])
