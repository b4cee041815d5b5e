"""Goldens: record directories kept as references (`reference: golden:DIR/<slug>`), listed in a manifest with the
content hash of every file, so a lane that downloads them can prove it holds the pinned set, and two sets can be
compared metric by metric (Megatron-LM refreshes its golden values by download-and-diff)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.harness.config.paths import RECORD, RECORD_FILES
from parity.harness.judge.compare import series_rel_diff, token_diff
from parity.harness.judge.perf import perf_metrics
from parity.harness.run.records import RunRecord
from parity.harness.run.ref_cache import sha256

MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"


def entry(root: Path, slug: str) -> dict[str, Any]:
    record = json.loads((root / slug / RECORD).read_text())
    return {"dir": slug, "scenario_hash": record["scenario_hash"],
            "device_name": record.get("provenance", {}).get("device_name"),
            "files": {name: sha256(root / slug / name) for name in RECORD_FILES if (root / slug / name).is_file()}}


def write_manifest(root: Path, slugs: dict[str, str], provenance: dict[str, Any]) -> Path:
    """slugs: scenario id -> record directory under root."""
    manifest = {"format": 1, "provenance": provenance,
                "goldens": {run_id: entry(root, slug) for run_id, slug in sorted(slugs.items())}}
    path = root / MANIFEST
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    # the same hashes for `sha256sum -c`, so a lane can check a download before the harness is installed
    (root / SUMS).write_text("".join(f"{digest}  {item['dir']}/{name}\n" for item in manifest["goldens"].values()
                                     for name, digest in item["files"].items()))
    return path


def load_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (not a golden directory written by `parity golden record`)")
    return json.loads(path.read_text())


def verify(root: Path) -> list[str]:
    """Every file the manifest lists, present with its hash; one problem per line (empty = verified)."""
    problems = []
    for run_id, item in load_manifest(root)["goldens"].items():
        for name, digest in item["files"].items():
            path = root / item["dir"] / name
            if not path.is_file():
                problems.append(f"{run_id}: {path} is missing")
            elif sha256(path) != digest:
                problems.append(f"{run_id}: {path} has sha256 {sha256(path)[:12]}…, the manifest says {digest[:12]}…")
    return problems


def manifest_of(record_dir: Path) -> Path | None:
    """The manifest that lists a golden record directory: in its golden set (the parent), or beside it."""
    for root in (record_dir.parent, record_dir):
        if (root / MANIFEST).is_file():
            return root / MANIFEST
    return None


def integrity(record_dir: Path) -> list[str]:
    """Why a golden used as a reference is not what its manifest pins: a file whose sha256 differs, a listed file
    that is missing, a record file the manifest does not list, a directory the manifest does not hold. Empty when
    it verifies, or when there is no manifest (a plain record directory: nothing to verify it against)."""
    manifest = manifest_of(record_dir)
    if manifest is None:
        return []
    try:
        goldens = json.loads(manifest.read_text())["goldens"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{manifest} is unreadable: {exc}"]
    root = manifest.parent
    item = next((g for g in goldens.values() if (root / g.get("dir", "")).resolve() == record_dir.resolve()), None)
    if item is None:
        return [f"{record_dir} is not listed in {manifest}"]
    problems = []
    for name in RECORD_FILES:  # the files a golden is; rank logs stay beside them unhashed
        path, digest = record_dir / name, item["files"].get(name)
        if digest is None:
            if path.is_file():
                problems.append(f"{path} is not listed in {manifest}")
        elif not path.is_file():
            problems.append(f"{path} is missing")
        elif (actual := sha256(path)) != digest:
            problems.append(f"{path} has sha256 {actual[:12]}…, {manifest} says {digest[:12]}…")
    return problems


@dataclass(frozen=True, slots=True)
class GoldenDelta:
    run_id: str
    metrics: dict[str, float]


def _rel(new: float, old: float) -> float:
    return (new - old) / old if old and not math.isnan(old) else math.nan


def delta(old: RunRecord, new: RunRecord) -> dict[str, float]:
    """How NEW differs from OLD: log-prob max |Δ| per phase, worst per-step loss / grad-norm rel diff, and the
    relative change of step time, tokens/s and peak memory."""
    mask = old.tensors["response_mask"]
    out = {f"{phase} max|Δ|": token_diff(new.tensors[phase], old.tensors[phase], mask).max_abs
           for phase in ("logprobs_before", "logprobs_after")}
    for name in ("loss", "grad_norm"):
        out[f"{name} rel (worst)"] = series_rel_diff([getattr(s, name) for s in new.steps],
                                                     [getattr(s, name) for s in old.steps]).worst
    old_perf = perf_metrics(old, str(old.provenance.get("dtype", "")), int(old.provenance.get("world_size", 1)))
    new_perf = perf_metrics(new, str(new.provenance.get("dtype", "")), int(new.provenance.get("world_size", 1)))
    for key in ("step_time_s", "tokens_per_s", "peak_memory_mb"):
        out[f"{key} change"] = _rel(new_perf[key], old_perf[key])
    return out


def diff(old_root: Path, new_root: Path) -> tuple[list[GoldenDelta], list[str]]:
    """Deltas of the goldens both sets hold, and one line per golden only one set holds."""
    old, new = load_manifest(old_root)["goldens"], load_manifest(new_root)["goldens"]
    only = [f"only in {old_root}: {run_id}" for run_id in old.keys() - new.keys()]
    only += [f"only in {new_root}: {run_id}" for run_id in new.keys() - old.keys()]
    deltas = [GoldenDelta(run_id, delta(RunRecord.load(old_root / old[run_id]["dir"]),
                                        RunRecord.load(new_root / new[run_id]["dir"])))
              for run_id in sorted(old.keys() & new.keys())]
    return deltas, sorted(only)
