"""The "not computed in bf16" lower bounds measure a forward's distance from an fp32 reference. Against a golden
that itself ran in bf16 (a stored run, e.g. the nightly's rehearsal golden recorded on the same numerics), agreeing
to the last bit is the best outcome: the bounds must not fire there. Against fp32 they must still catch a bf16 row
that computed in fp32 (the planted case), and a golden's own fp32 record keeps them."""

from __future__ import annotations

from types import SimpleNamespace

from parity.harness.contract.schema import Tolerance
from parity.harness.judge.tolerances import limits_for
from parity.harness.judge.verdict import precision_problems


def _metrics(max_abs: float) -> dict:
    return {"logprobs_before": {"max_abs": max_abs}, "entropy_before": {"max_abs": max_abs, "median_abs": max_abs}}


LIMITS = limits_for("bf16", Tolerance())
CANDIDATE = SimpleNamespace(effective_dtype="bf16")


def test_a_bf16_row_equal_to_fp32_is_caught():
    found = precision_problems("bf16", CANDIDATE, _metrics(0.0), LIMITS, against_fp32=True)
    assert any("not computed in bf16" in problem for problem in found), found


def test_a_bf16_row_equal_to_a_bf16_golden_passes_the_precision_check():
    assert precision_problems("bf16", CANDIDATE, _metrics(0.0), LIMITS, against_fp32=False) == []


def test_the_engines_own_dtype_report_still_counts_against_a_golden():
    fp32_engine = SimpleNamespace(effective_dtype="fp32")
    found = precision_problems("bf16", fp32_engine, _metrics(0.0), LIMITS, against_fp32=False)
    assert found == ["computed in fp32, the scenario asks for bf16 (Engine.effective_dtype read back from the engine)"]
