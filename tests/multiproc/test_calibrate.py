"""`parity calibrate` end to end: each clean scenario at its own seed and once per seed, faulted ones left out."""

from __future__ import annotations

import json

from parity.harness.cli import main


def test_calibrate_command_runs_each_clean_scenario_per_seed(write_yaml, tmp_path, cache_dir):
    scenarios = write_yaml("matrix:\n  - {model: tiny-qwen3, strategy: hf}\n"
                           "  - {model: tiny-qwen3, strategy: hf, faults: [{kind: grad_scale}]}\n")
    out = tmp_path / "cal"
    # in-process (`parity` in a fresh interpreter is tested by test_cli / test_bad_input): the session's warm
    # forkserver serves it
    assert main(["calibrate", str(scenarios), "--seeds", "1", "--out", str(out), "--cache-dir", str(cache_dir)]) == 0
    report = json.loads((out / "calibration.json").read_text())
    # its own seed (1234) and seed 0; the faulted scenario is not calibrated on
    assert report["runs"] == 2 and report["false_fails"] == []
    assert report["distribution"]["logprob_max_abs"]["worst"] == 0.0  # hf vs the hf reference: bit-identical
