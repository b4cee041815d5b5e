"""A cached reference whose numbers were altered on disk is computed again, not judged against: the run PASSes
and the warning names the entry (before: judged against the altered numbers, or ERROR on every later run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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


def _entry(cache: Path, scenario: Scenario, runner: Runner) -> Path:
    reference = reference_scenario(scenario)
    return cache / "refs" / f"{slug(reference.id)}-{cache_key(reference, runner._sources)}"


def _copied_cache(runner, cache_dir: Path, tmp_path: Path) -> tuple[Path, Scenario]:
    """A private cache holding the session's tiny-qwen3 reference (its entry copied, sums and all)."""
    scenario = Scenario(model="tiny-qwen3", strategy="hf")
    assert runner._reference(scenario).ok
    cache = tmp_path / "cache"
    shutil.copytree(cache_dir / "models", cache / "models")
    name = _entry(cache_dir, scenario, runner).name
    shutil.copytree(cache_dir / "refs" / name, cache / "refs" / name)
    return cache, scenario


def test_a_cached_reference_that_recomputing_does_not_give_is_refused(runner, cache_dir, tmp_path):
    """An entry whose sums match but whose numbers are not what its code computes (stored under a key of other
    code: the tree edited mid-session before the key was taken from what ran): the recheck recomputes it, refuses
    it and removes it; the scenario ERRORs naming it. Its clean twin, the entry as stored, PASSes the recheck."""
    cache, scenario = _copied_cache(runner, cache_dir, tmp_path)
    clean = Runner(RunOptions(out_dir=tmp_path / "clean", cache_dir=cache))
    entry = _entry(cache, scenario, clean)
    verdict = clean.run_scenario(scenario)
    assert verdict.status == "PASS", verdict.reasons
    assert clean._rechecks_left == 0 and entry.is_dir()  # rechecked, and kept
    tensors = entry / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-8:] = bytes(8)  # the last tokens' numbers zeroed, and the sums written again to match
    tensors.write_bytes(bytes(data))
    sums = json.loads((entry / ref_cache.SUMS).read_text())
    (entry / ref_cache.SUMS).write_text(json.dumps(sums | {"tensors.safetensors": ref_cache.sha256(tensors)}))
    assert ref_cache.problem(entry) is None  # the integrity check alone trusts it
    verdict = Runner(RunOptions(out_dir=tmp_path / "planted", cache_dir=cache)).run_scenario(scenario)
    assert verdict.status == "ERROR"
    assert any(f"cached reference {entry} is not what recomputing it gives (logprobs" in r or
               f"cached reference {entry} is not what recomputing it gives (entropy" in r
               for r in verdict.reasons), verdict.reasons
    assert not entry.exists()


def test_an_entry_computed_after_the_tree_changed_mid_session_is_not_written(runner, cache_dir, tmp_path, capsys):
    """The ranks run what the forkserver imported when the session started: a reference computed after a source
    file changed is used by this run but not cached under a key of either code. Its twin, an unchanged tree,
    writes the entry."""
    scenario = Scenario(model="tiny-qwen3", strategy="hf", workload={"seed": 4321})
    cache = tmp_path / "cache"
    shutil.copytree(cache_dir / "models", cache / "models")
    edited = Runner(RunOptions(out_dir=tmp_path / "edited", cache_dir=cache))
    models = next(p for p in edited._sources._digests if p.name == "models.py" and p.parent.name == "config")
    edited._sources._digests[models] = "0" * 64  # as read at the session's start; the file on disk differs now
    entry = _entry(cache, scenario, edited)
    assert edited._reference(scenario).ok
    assert not entry.exists()
    assert f"{entry.name} not cached: the source tree changed during this session ({models}" in capsys.readouterr().err
    clean = Runner(RunOptions(out_dir=tmp_path / "clean", cache_dir=cache))
    assert clean._reference(scenario).ok and _entry(cache, scenario, clean).is_dir()
