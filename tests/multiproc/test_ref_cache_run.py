"""A cached reference whose numbers were altered on disk is computed again, not judged against: the run PASSes
and the warning names the entry (before: judged against the altered numbers, or ERROR on every later run)."""

from __future__ import annotations

import shutil

from parity.harness.contract.schema import Scenario
from parity.harness.runner import Runner, RunOptions


def test_a_corrupt_cached_reference_is_computed_again_and_the_run_passes(cache_dir, tmp_path, capsys):
    cache = tmp_path / "cache"
    shutil.copytree(cache_dir / "models", cache / "models")  # the tiny checkpoint; the reference is computed here
    scenario = Scenario(model="tiny-qwen3", strategy="hf", workload={"seed": 77})
    first = Runner(RunOptions(out_dir=tmp_path / "first", cache_dir=cache)).run_scenario(scenario)
    assert first.status == "PASS", first.reasons
    (entry,) = [p for p in (cache / "refs").iterdir() if not p.name.startswith(".")]
    tensors = entry / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-8:] = bytes(8)  # the last tokens' numbers zeroed: still a loadable file
    tensors.write_bytes(bytes(data))
    capsys.readouterr()
    second = Runner(RunOptions(out_dir=tmp_path / "second", cache_dir=cache)).run_scenario(scenario)
    assert second.status == "PASS", second.reasons
    assert f"cached run {entry} cannot be trusted ({tensors} does not match its sha256" in capsys.readouterr().err
    assert second.metrics["logprob_max_abs"] == 0.0  # against the recomputed reference, not the zeroed one
