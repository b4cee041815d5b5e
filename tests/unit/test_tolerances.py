"""One list of limits: every field a scenario's `tolerance:` may set is a limit of every dtype lane and reaches the
judge when set, and a lane that leaves out a limit every judgement uses is refused where it is written."""

from __future__ import annotations

import pydantic
import pytest

from parity.harness.contract.schema import Tolerance
from parity.harness.judge.tolerances import DEFAULTS, FP32, Limits, limits_for

pytestmark = pytest.mark.torch_free


@pytest.mark.parametrize("dtype", sorted(DEFAULTS))
@pytest.mark.parametrize("name", sorted(Tolerance.model_fields))
def test_every_tolerance_field_overrides_its_limit(dtype, name):
    value = 3 if Tolerance.model_fields[name].annotation == int | None else 0.125  # a count (ratio_step_window)
    assert getattr(limits_for(dtype, Tolerance(**{name: value})), name) == value
    unset = limits_for(dtype, Tolerance())
    assert unset == DEFAULTS[dtype] and getattr(unset, name) == getattr(DEFAULTS[dtype], name)


def test_the_lower_bounds_are_the_lanes_own():
    """The bounds that prove a dtype are not a scenario's to loosen: `tolerance:` refuses them."""
    judge_only = set(Limits.model_fields) - set(Tolerance.model_fields)
    assert judge_only == {"logprob_max_abs_min", "entropy_max_abs_min", "entropy_median_abs_max", "ratio_median_min"}
    with pytest.raises(pydantic.ValidationError, match="extra"):
        Tolerance(logprob_max_abs_min=0.0)


def test_a_lane_without_a_limit_every_judgement_uses_is_refused():
    with pytest.raises(pydantic.ValidationError, match="a lane's limits must set kl_k3"):
        Limits(**FP32.model_dump(exclude={"kl_k3"}))
