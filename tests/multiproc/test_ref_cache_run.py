"""A cached reference whose numbers were altered on disk is computed again, not judged against: the run PASSes
and the warning names the entry (before: judged against the altered numbers, or ERROR on every later run)."""

from __future__ import annotations

import shutil

from parity.harness.config.paths import slug
from parity.harness.contract.schema import Scenario
from parity.harness.judge.reference import cache_key, reference_scenario
from parity.harness.run import ref_cache
from parity.harness.runner import Runner, RunOptions


def test_a_corrupt_cached_reference_is_computed_again_and_the_run_passes(runner, cache_dir, tmp_path, capsys):
    scenario = Scenario(model="tiny-qwen3", strategy="hf")
    assert runner._reference(scenario).ok  # the session's entry (tiny-qwen3, default workload), copied here
    cache = tmp_path / "cache"
    shutil.copytree(cache_dir / "models", cache / "models")
    reference = reference_scenario(scenario)
    name = f"{slug(reference.id)}-{cache_key(reference)}"
    assert ref_cache.problem(cache_dir / "refs" / name) is None
    entry = cache / "refs" / name
    shutil.copytree(cache_dir / "refs" / name, entry)
    tensors = entry / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-8:] = bytes(8)  # the last tokens' numbers zeroed: still a loadable file
    tensors.write_bytes(bytes(data))
    capsys.readouterr()
    verdict = Runner(RunOptions(out_dir=tmp_path / "out", cache_dir=cache)).run_scenario(scenario)
    assert verdict.status == "PASS", verdict.reasons
    assert f"cached run {entry} cannot be trusted ({tensors} does not match its sha256" in capsys.readouterr().err
    assert verdict.metrics["logprob_max_abs"] == 0.0  # against the recomputed reference, not the zeroed one
