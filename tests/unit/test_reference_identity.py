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
    assert golden_mismatch({}, HF) == ["no recorded model, model_identity, workload, dtype, faults (a golden "
                                       "recorded before provenance was stored: record it again)"]


def test_golden_identity_covers_defaults_of_the_workload_dtype_and_faults():
    """The advantages mode is left out of the workload's JSON at its default: a golden of GRPO groups was taken
    for the default workload (and the other way round). A bf16 golden for an fp32 scenario, and a golden recorded
    with a planted fault, are refused too."""
    grouped = Scenario(model="tiny-qwen3", strategy="hf",
                       workload={"batch_size": 8, "advantages": "group_normalized", "group_size": 4})
    plain = Scenario(model="tiny-qwen3", strategy="hf", workload={"batch_size": 8})
    assert golden_mismatch(run_identity(grouped), plain) == ["workload.advantages 'group_normalized' vs 'seeded'",
                                                             "workload.group_size 4 vs None"]
    assert golden_mismatch(run_identity(plain), grouped) == ["workload.advantages 'seeded' vs 'group_normalized'",
                                                             "workload.group_size None vs 4"]
    bf16 = HF.model_copy(update={"dtype": "bf16"})
    assert golden_mismatch(run_identity(bf16), HF) == ["dtype bf16 vs fp32"]
    faulted = Scenario(model="tiny-qwen3", strategy="hf", faults=[{"kind": "grad_scale"}])
    assert golden_mismatch(run_identity(faulted), HF) == ["it was recorded with faults (grad_scale): not a clean "
                                                          "reference"]


def test_a_real_checkpoint_is_identified_by_content_not_by_file_times(tmp_path):
    import os

    from parity.harness.config.models import model_identity

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "qwen3"}')
    (ckpt / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    before = model_identity(str(ckpt))
    os.utime(ckpt / "model.safetensors", (1_000_000_000, 1_000_000_000))  # copied to another node: new mtime
    shutil.copytree(ckpt, tmp_path / "copy")
    assert model_identity(str(ckpt)) == model_identity(str(tmp_path / "copy")) == before
    weights = bytearray((ckpt / "model.safetensors").read_bytes())
    weights[1000] ^= 1  # one bit, same size, the same mtime as before
    stat = (ckpt / "model.safetensors").stat()
    (ckpt / "model.safetensors").write_bytes(bytes(weights))
    os.utime(ckpt / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert model_identity(str(ckpt)) != before


def test_a_mismatched_golden_errors_that_scenario_naming_the_fields(tmp_path):
    golden = tmp_path / "golden"
    RunRecord("g", "h", "ok", provenance=run_identity(HF)).save(golden)
    judged = Scenario(model="tiny-qwen3", strategy="hf", reference=f"golden:{golden}", workload={"seed": 5})
    verdict = Runner(RunOptions(out_dir=tmp_path / "out", cache_dir=tmp_path / "cache")).run_scenario(judged)
    assert verdict.status == "ERROR"
    assert verdict.reasons == [f"reference run error: golden {golden} does not match the scenario: "
                               "workload.seed 1234 vs 5"]


def test_a_golden_set_s_manifest_is_checked_file_by_file(tmp_path):
    """golden.integrity: what a lane judges against must be what `parity golden record` hashed."""
    from parity.harness.judge import golden

    root = tmp_path / "goldens"
    RunRecord("g", "h", "ok", provenance=run_identity(HF)).save(root / "a")
    (root / "a" / "tensors.safetensors").write_bytes(b"numbers")
    golden.write_manifest(root, {"tiny-qwen3/hf/single/fp32/cpu": "a"}, {})
    assert golden.integrity(root / "a") == []
    RunRecord("g", "h", "ok").save(root / "b")  # a record beside the set, not in its manifest
    assert golden.integrity(root / "b") == [f"{root / 'b'} is not listed in {root / golden.MANIFEST}"]
    (root / "a" / "tensors.safetensors").unlink()
    assert golden.integrity(root / "a") == [f"{root / 'a' / 'tensors.safetensors'} is missing"]
    assert golden.integrity(tmp_path / "no-manifest") == []  # a plain record directory: nothing to check against
