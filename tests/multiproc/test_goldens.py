"""Golden lifecycle: record a set with a manifest, verify it (and catch a tampered file or a wrong pin), diff two
sets, and judge a run against a golden with its speed side by side."""

from __future__ import annotations

import json
import shutil
import subprocess

from parity.harness.cli import main

SCENARIO = "matrix:\n  - {model: tiny-qwen3, strategy: hf}\n"
SLUG = "tiny-qwen3__hf__single__fp32__cpu"


def test_record_verify_diff_and_judge_against_a_golden(write_yaml, tmp_path, cache_dir, capsys):
    old = tmp_path / "goldens-old"
    assert main(["golden", "record", str(write_yaml(SCENARIO)), "--device", "cpu", "--out", str(old),
                 "--cache-dir", str(cache_dir)]) == 0
    manifest = json.loads((old / "manifest.json").read_text())
    item = manifest["goldens"]["tiny-qwen3/hf/single/fp32/cpu"]
    assert item["dir"] == SLUG and set(item["files"]) == {"record.json", "tensors.safetensors"}
    assert manifest["provenance"]["harness_commit"] and item["scenario_hash"]
    assert main(["golden", "verify", str(old)]) == 0
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=old, capture_output=True).returncode == 0
    assert main(["golden", "verify", str(old), "--sha256", "0" * 64]) == 1  # not the pinned manifest

    new = tmp_path / "goldens-new"
    shutil.copytree(old, new)
    record = json.loads((new / SLUG / "record.json").read_text())
    for step in record["steps"]:
        step["loss"] *= 1.01
        step["step_time_s"] *= 2
    (new / SLUG / "record.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["golden", "verify", str(new)]) == 1
    assert f"{SLUG}/record.json has sha256" in capsys.readouterr().out
    assert main(["golden", "diff", str(old), str(new)]) == 0
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    cells = dict(zip(header.split(), row.split(), strict=False))
    assert "loss rel (worst)" in header and row.startswith("tiny-qwen3/hf/single/fp32/cpu")
    assert "0.01" in row and "+1" in row and cells["id"] == "tiny-qwen3/hf/single/fp32/cpu"

    # judged against the edited copy: refused by its manifest's hash (before, judged against: FAIL for the wrong
    # reason), naming the file; nothing is launched
    tampered = f"matrix:\n  - {{model: tiny-qwen3, strategy: hf, reference: 'golden:{new / SLUG}'}}\n"
    assert main(["run", str(write_yaml(tampered, "tampered.yaml")), "--out", str(tmp_path / "out-tampered"),
                 "--cache-dir", str(cache_dir)]) == 1
    refused = json.loads((tmp_path / "out-tampered" / "results.jsonl").read_text())
    assert refused["verdict"] == "ERROR" and "is not the one its manifest pins" in refused["reasons"][0]
    assert f"{new / SLUG / 'record.json'} has sha256" in refused["reasons"][0]

    judged = f"matrix:\n  - {{model: tiny-qwen3, strategy: hf, reference: 'golden:{old / SLUG}'}}\n"
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(judged, "judged.yaml")), "--out", str(out), "--cache-dir",
                 str(cache_dir)]) == 0
    result = json.loads((out / "results.jsonl").read_text())
    assert result["metrics"]["logprob_max_abs"] == 0.0  # the same engine and device as the golden
    assert "warnings" not in result  # verified against its manifest
    ratio = result["metrics"]["vs_reference"]
    assert ratio["tokens_per_s"] > 0 and ratio["peak_memory_mb"] > 0
