"""Comparators and verdicts on synthetic records: each must catch an injected defect."""

from __future__ import annotations

import math

import pytest
import torch

from parity.harness.contract.schema import Scenario
from parity.harness.judge.compare import error_ratio, rel_diff, series_rel_diff, token_diff
from parity.harness.judge.verdict import dropped_kwargs, judge
from parity.harness.run.records import RunRecord, StepRecord


def make_record(seed: int = 0, losses=(0.5, 0.4), norms=(3.0, 1.0), noise: float = 0.0) -> RunRecord:
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(4, 8, generator=gen) * 5
    mask = torch.ones(4, 8, dtype=torch.long)
    mask[0, 6:] = 0
    tensors = {"logprobs_before": logp + noise, "logprobs_after": logp - 0.01 + noise,
               "entropy_before": -logp + noise, "entropy_after": -logp + 0.01 + noise, "response_mask": mask}
    steps = [StepRecord(i + 1, loss, norm, 0.1) for i, (loss, norm) in enumerate(zip(losses, norms, strict=True))]
    return RunRecord(run_id="x", scenario_hash="h", status="ok", steps=steps, tensors=tensors)


SCENARIO = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2})


def test_identical_records_pass():
    verdict = judge(SCENARIO, make_record(), make_record())
    assert verdict.status == "PASS" and verdict.reasons == []
    assert verdict.metrics["logprob_max_abs"] == 0.0


def test_token_diff_ignores_padding_but_sees_every_real_token():
    ref = make_record()
    cand = make_record()
    cand.tensors["logprobs_before"] = cand.tensors["logprobs_before"].clone()
    cand.tensors["logprobs_before"][0, 7] += 10.0  # padded position: must not count
    assert judge(SCENARIO, cand, ref).status == "PASS"
    cand.tensors["logprobs_before"][3, 7] += 1e-3  # one real token off by 1e-3
    verdict = judge(SCENARIO, cand, ref)
    assert verdict.status == "FAIL"
    assert any(r.startswith("log-prob before training max |Δ| = 0.001") and "limit 5e-05" in r
               for r in verdict.reasons)


def test_token_diff_statistics():
    ref = torch.zeros(2, 3)
    cand = torch.tensor([[0.1, 0.0, 0.0], [0.0, 0.0, 0.3]])
    diff = token_diff(cand, ref, torch.ones(2, 3))
    assert diff.max_abs == pytest.approx(0.3) and diff.mean_abs == pytest.approx(0.4 / 6)
    assert diff.kl_k3 == pytest.approx(((math.exp(-0.1) + 0.1 - 1) + (math.exp(-0.3) + 0.3 - 1)) / 6)
    with pytest.raises(ValueError, match="shape mismatch"):
        token_diff(torch.zeros(2, 2), ref, torch.ones(2, 3))


@pytest.mark.parametrize("step", [1, 2])
def test_grad_norm_defect_on_any_step_is_caught(step):
    norms = [3.0, 1.0]
    norms[step - 1] *= 2
    verdict = judge(SCENARIO, make_record(norms=tuple(norms)), make_record())
    assert verdict.status == "FAIL"
    limit = 5e-5 + 1e-6 / norms[step - 1] * 2  # rtol + atol / |reference|
    assert verdict.reasons == [f"pre-clip grad norm rel diff at step {step} = 1 > limit {limit:.3g} "
                               f"(rel; rtol 5e-05 + atol 1e-06/|ref {norms[step - 1] / 2:g}|)"]


def test_loss_defect_names_the_step():
    verdict = judge(SCENARIO, make_record(losses=(0.5, 0.41)), make_record())
    assert verdict.reasons == ["loss rel diff at step 2 = 0.025 > limit 2.25e-05 "
                               "(rel; rtol 2e-05 + atol 1e-06/|ref 0.4|)"]


def test_loss_near_zero_is_judged_with_the_absolute_term():
    """A GRPO loss can cancel to ~1e-5: fp32 rounding (1e-8) is then a relative error of 1e-3, not a defect."""
    near_zero = make_record(losses=(1e-5, 0.4))
    assert judge(SCENARIO, make_record(losses=(1e-5 + 1e-8, 0.4)), near_zero).status == "PASS"
    verdict = judge(SCENARIO, make_record(losses=(2e-5, 0.4)), near_zero)  # 1e-5 off: 10x the atol
    assert verdict.status == "FAIL" and verdict.reasons[0].startswith("loss rel diff at step 1 = 1 > limit 0.1 ")


def test_nan_never_passes():
    cand = make_record(losses=(0.5, math.nan))
    cand.tensors["logprobs_after"] = torch.full((4, 8), math.nan)
    verdict = judge(SCENARIO, cand, make_record())
    assert verdict.status == "FAIL"
    assert any("loss rel diff at step 2 = nan" in r for r in verdict.reasons)
    assert any("log-prob after the last step max |Δ| = nan" in r for r in verdict.reasons)
    # the headline metrics show the NaN too (the worst of before and after was 0.0: max(0.0, nan))
    assert math.isnan(verdict.metrics["logprob_max_abs"]) and math.isnan(verdict.metrics["logprob_mean_abs"])


def test_nan_metrics_survive_results_jsonl_as_strict_json(tmp_path):
    """NaN / inf are written as null plus a `non_finite` path map (strict JSON), and read back as NaN / inf."""
    import json

    from parity.reports import results
    from parity.reports.table import ERRORS, parity_table

    cand = make_record(losses=(0.5, math.nan), norms=(3.0, math.inf))
    cand.tensors["logprobs_after"] = torch.full((4, 8), math.nan)
    row = judge(SCENARIO, cand, make_record()).to_json()
    results.append(tmp_path, row)
    line = (tmp_path / "results.jsonl").read_text()
    data = json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in results.jsonl"))
    assert data["metrics"]["logprob_max_abs"] is None and data["non_finite"]["metrics.logprob_max_abs"] == "nan"
    assert data["non_finite"]["metrics.grad_norm_rel.1"] == "inf"
    back = results.load([tmp_path])[0]
    assert math.isnan(back["metrics"]["logprob_max_abs"]) and back["metrics"]["grad_norm_rel"][1] == math.inf
    assert "non_finite" not in back and "| nan " in parity_table([back], ERRORS)


def test_missing_step_fails():
    cand = make_record(losses=(0.5,), norms=(3.0,))
    series = series_rel_diff([0.5], [0.5, 0.4])
    assert series.per_step == (0.0, math.inf) and series.worst_step == 2
    assert judge(SCENARIO, cand, make_record()).status == "FAIL"


def test_rel_diff_and_ratio_edge_cases():
    assert rel_diff(1.0, 0.0) == pytest.approx(1e12)
    assert rel_diff(math.inf, 1.0) == math.inf
    assert math.isnan(rel_diff(1.0, math.nan))
    assert error_ratio(1e-6, 0.0, floor=1e-4) == pytest.approx(0.01)
    assert math.isnan(error_ratio(math.nan, 1.0, floor=1e-4))
    assert series_rel_diff([1.0, math.nan, 2.0], [1.0, 1.0, 1.0]).worst_step == 2


#: a bf16 three-way row under the wide absolute bar (no measured class: an accelerator's), so that what is judged
#: is the ratio
BF16_WIDE = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2}, dtype="bf16", baseline="hf", device="npu")


def test_three_way_lane_judges_the_ratio_not_the_absolute_error():
    bf16 = BF16_WIDE
    ref = make_record()
    baseline = make_record(noise=0.01)
    assert judge(bf16, make_record(noise=0.035), ref, baseline).status == "PASS"  # 3.5x the baseline error
    verdict = judge(bf16, make_record(noise=0.045), ref, baseline)  # 4.5x: worse than the limit of 4
    assert verdict.status == "FAIL"
    assert any("median |Δ| ratio to baseline = 4.5 > limit 4 (ratio)" in r for r in verdict.reasons)


def test_three_way_median_ratio_ignores_a_few_flipped_tokens_but_not_a_shift_of_most():
    """A top-k routing flip moves a few tokens far (clean MoE runs: mean ratio 4.8, max ratio 15); the median
    ratio stays near 1 for that, and sees an error that moves most tokens."""
    bf16 = BF16_WIDE
    ref, baseline = make_record(), make_record(noise=0.01)
    flipped = make_record(noise=0.01)
    for key in ("logprobs_before", "logprobs_after"):
        flipped.tensors[key] = flipped.tensors[key].clone()
        flipped.tensors[key][1, :3] -= 0.5  # 3 of 30 real tokens: mean ratio 5.8, max ratio 49
    verdict = judge(bf16, flipped, ref, baseline)
    assert verdict.status == "PASS", verdict.reasons
    assert verdict.metrics["logprobs_before"]["ratio_mean"] > 5 and verdict.metrics["logprobs_before"]["ratio_max"] > 40
    shifted = make_record(noise=0.01)
    for key in ("logprobs_before", "logprobs_after"):
        shifted.tensors[key] = shifted.tensors[key].clone()
        shifted.tensors[key][:, :6] -= 0.06  # 24 of 30 real tokens 5x further
    verdict = judge(bf16, shifted, ref, baseline)
    assert any("log-prob before training median |Δ| ratio to baseline" in r for r in verdict.reasons)
    strict = Scenario.model_validate({**bf16.model_dump(), "tolerance": {"ratio_mean": 2.0, "ratio_max": 10.0}})
    reasons = judge(strict, flipped, ref, baseline).reasons  # the mean and max ratios stay available, opt-in
    assert any("mean |Δ| ratio to baseline" in r for r in reasons) and any("max |Δ| ratio" in r for r in reasons)


BF16_VS_HF = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2}, dtype="bf16", baseline="hf")


@pytest.mark.parametrize(("phase", "value"), [("logprobs_before", math.inf), ("entropy_before", math.nan)])
def test_non_finite_baseline_errors_naming_the_baseline(phase, value):
    """An infinite baseline error used to make every ratio 0: a candidate 3 nats off PASSed."""
    baseline = make_record()
    baseline.tensors[phase] = torch.full((4, 8), value)
    verdict = judge(BF16_VS_HF, make_record(noise=3.0), make_record(), baseline)
    assert verdict.status == "ERROR"
    assert verdict.reasons[0].startswith("baseline hf (x) is unusable as a bar: ")
    nan_loss = make_record(losses=(0.5, math.nan))
    assert "loss at step 2 = nan" in judge(BF16_VS_HF, make_record(), make_record(), nan_loss).reasons[0]
    assert math.isnan(error_ratio(0.1, math.inf, floor=1e-4))


def test_three_way_candidate_must_stay_under_its_precision_absolute_bound():
    """A baseline as wrong as the candidate keeps every ratio at 1; the absolute bound still FAILs it."""
    for row, limit in ((BF16_VS_HF, "0.11"), (BF16_WIDE, "1.5")):  # a measured dense CPU row; the wide bar
        verdict = judge(row, make_record(noise=3.0), make_record(), make_record(noise=3.0))
        assert verdict.status == "FAIL"
        assert f"log-prob before training max |Δ| = 3 > limit {limit} (abs)" in verdict.reasons
        assert not any("ratio" in r for r in verdict.reasons)


def test_tolerance_override_applies():
    loose = Scenario.model_validate({**SCENARIO.model_dump(), "tolerance": {"grad_norm_rel": 2.0}})
    assert judge(loose, make_record(norms=(6.0, 1.0)), make_record()).status == "PASS"


def test_dropped_kwargs_fail_the_verdict():
    scenario = Scenario(model="tiny-qwen3", strategy="fsdp2", fsdp_kwargs={"reshard_after_forward": False,
                                                                            "typo_key": 1})
    cand = make_record()
    cand.applied_kwargs = {"fsdp_kwargs": {"reshard_after_forward": False}}
    assert dropped_kwargs(scenario, cand) == ["fsdp_kwargs.typo_key"]
    verdict = judge(scenario, cand, make_record())
    assert verdict.status == "FAIL" and "dropped engine kwargs: fsdp_kwargs.typo_key" in verdict.reasons[0]


def test_record_round_trip(tmp_path):
    record = make_record()
    record.save(tmp_path)
    loaded = RunRecord.load(tmp_path)
    assert loaded.steps == record.steps
    assert torch.equal(loaded.tensors["logprobs_before"], record.tensors["logprobs_before"])


def test_low_precision_run_that_computed_in_fp32_fails():
    """Upper bounds alone let a bf16 scenario whose engine silently ran in fp32 PASS with every difference 0."""
    bf16 = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2}, dtype="bf16")
    verdict = judge(bf16, make_record(), make_record())
    assert verdict.status == "FAIL"
    assert verdict.reasons == ["not computed in bf16: log-prob before training max |Δ| vs fp32 = 0 < 0.001, the least "
                               "a bf16 forward differs by (lower bound)",
                               "not computed in bf16: entropy before training max |Δ| vs fp32 = 0 < 5e-05, the least "
                               "a bf16 forward differs by (lower bound)"]
    rounded = make_record()  # log-probs rounded to bf16 after an fp32 forward: they clear the log-prob bound
    rounded.tensors["logprobs_before"] = rounded.tensors["logprobs_before"].bfloat16().float()
    assert [r.split(" vs ")[0] for r in judge(bf16, rounded, make_record()).reasons] == [
        "not computed in bf16: entropy before training max |Δ|"]
    honest = make_record(noise=0.0015)  # as far from fp32 as bf16 arithmetic, not as rounding to bf16
    assert judge(bf16, honest, make_record()).status == "PASS"
    honest.effective_dtype = "fp32"  # the engine itself says it computed in fp32
    assert judge(bf16, honest, make_record()).reasons == [
        "computed in fp32, the scenario asks for bf16 (Engine.effective_dtype read back from the engine)"]
    assert judge(SCENARIO, make_record(), make_record()).status == "PASS"  # fp32: no lower bound


def test_repeats_must_be_bit_identical():
    from parity.harness.judge.verdict import determinism_problems

    assert determinism_problems(make_record(), [make_record()]) == []
    nan_both = make_record(losses=(math.nan, 0.4))
    assert determinism_problems(nan_both, [make_record(losses=(math.nan, 0.4))]) == []
    drifted = make_record(norms=(3.0, 1.0 + 1e-12))
    drifted.tensors["logprobs_after"] = drifted.tensors["logprobs_after"] + 0.25
    verdict = judge(SCENARIO, make_record(), make_record(), repeats=[make_record(), drifted])
    assert verdict.status == "FAIL"
    assert [r for r in verdict.reasons if r.startswith("not deterministic")] == [
        "not deterministic: run 3 log-prob after the last step differs from run 1 (max |Δ| 0.25)",
        "not deterministic: run 3 pre-clip grad norm differs from run 1 at step 2"]


def test_entropy_after_training_is_compared():
    """A defect that only shows in the trained distribution's spread (not in the sampled tokens' log-probs)."""
    cand = make_record()
    cand.tensors["entropy_after"] = cand.tensors["entropy_after"] + 1e-3
    verdict = judge(SCENARIO, cand, make_record())
    assert verdict.status == "FAIL"
    assert verdict.reasons[0].startswith("entropy after the last step max |Δ| = 0.001")


def loss_reasons(candidate_losses, baseline_losses) -> list[str]:
    verdict = judge(BF16_VS_HF, make_record(losses=candidate_losses), make_record(),
                    make_record(losses=baseline_losses))
    return [r for r in verdict.reasons if r.startswith("loss rel diff at")]


def test_after_an_update_the_bar_allows_the_same_recipe_baselines_own_lag_and_no_more():
    """A checkpoint on the bf16 grid rounds away an update fp32 takes: the candidate and the baseline lag the
    reference's step-2 loss alike (0.4 -> 0.21 and 0.2), which PASSes; the same candidate beside a baseline that
    kept up FAILs, and so does a lag the baseline does not share at step 1, before any update."""
    assert loss_reasons((0.5, 0.21), (0.5, 0.2)) == []
    assert [r.split(" = ")[0] for r in loss_reasons((0.5, 0.21), (0.5, 0.399))] == ["loss rel diff at step 2"]
    assert [r.split(" = ")[0] for r in loss_reasons((0.45, 0.4), (0.4, 0.4))] == ["loss rel diff at step 1"]


def test_a_baseline_far_off_widens_the_bar_at_most_threefold():
    """A baseline 100 % off at step 2 (a defect of its own) does not carry a candidate as far with it."""
    assert loss_reasons((0.5, 0.0), (0.5, 0.0)) != []  # 0.4 off: past 0.2 x 0.4 + 0.01 times three
    assert loss_reasons((0.5, 0.3), (0.5, 0.0)) == []  # 0.1 off: inside it
