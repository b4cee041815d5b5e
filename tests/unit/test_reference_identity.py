"""A cached reference is keyed on the code that computed it; a golden must match the scenario it judges."""

from __future__ import annotations

import shutil

from parity.harness.contract.schema import Scenario
from parity.harness.judge import reference
from parity.harness.judge.reference import cache_key, code_hash, golden_mismatch, run_identity
from parity.harness.run.records import RunRecord
from parity.harness.runner import Runner, RunOptions
from tests.conftest import REPO

HF = Scenario(model="tiny-qwen3", strategy="hf")


def test_an_edit_to_the_reference_code_changes_the_cache_key(tmp_path, monkeypatch):
    """Copy the modules the reference imports, edit one: the hash (and so the cache key) moves."""
    package = tmp_path / "refcode"
    shutil.copytree(REPO / "harness" / "contract", package)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_hash(("refcode",))
    assert code_hash(("refcode",)) == before  # stable
    losses = package / "losses.py"
    losses.write_text(losses.read_text().replace("clip_ratio", "clip_ratio * 1.0", 1))
    assert code_hash(("refcode",)) != before
    key = cache_key(HF)
    monkeypatch.setattr(reference, "REFERENCE_CODE", (*reference.REFERENCE_CODE, "refcode"))
    assert cache_key(HF) != key


def test_golden_provenance_must_match_model_workload_and_seed():
    recorded = run_identity(HF)
    assert golden_mismatch(recorded, HF) == []
    other_seed = HF.model_copy(update={"workload": HF.workload.model_copy(update={"seed": 7, "steps": 3})})
    assert golden_mismatch(recorded, other_seed) == ["workload.seed 1234 vs 7", "workload.steps 2 vs 3"]
    other_model = Scenario(model="tiny-llama", strategy="hf")
    assert golden_mismatch(recorded, other_model)[0].startswith("model tiny-qwen3 (")
    assert golden_mismatch({}, HF) == ["no recorded model, model_identity, workload (a golden recorded before "
                                       "provenance was stored)"]


def test_a_mismatched_golden_errors_that_scenario_naming_the_fields(tmp_path):
    golden = tmp_path / "golden"
    RunRecord("g", "h", "ok", provenance=run_identity(HF)).save(golden)
    judged = Scenario(model="tiny-qwen3", strategy="hf", reference=f"golden:{golden}", workload={"seed": 5})
    verdict = Runner(RunOptions(out_dir=tmp_path / "out", cache_dir=tmp_path / "cache")).run_scenario(judged)
    assert verdict.status == "ERROR"
    assert verdict.reasons == [f"reference run error: golden {golden} does not match the scenario: "
                               "workload.seed 1234 vs 5"]
