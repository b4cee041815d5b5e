"""results.jsonl: one JSON line per scenario, appended as each finishes so a crash loses nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = "results.jsonl"


def append(out_dir: Path, result: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / RESULTS, "a") as handle:
        handle.write(json.dumps(result, default=str, allow_nan=True) + "\n")
        handle.flush()


def reset(out_dir: Path) -> None:
    (out_dir / RESULTS).unlink(missing_ok=True)


def load(directories: list[Path]) -> list[dict[str, Any]]:
    """Results of several shards, merged; a later line for the same id wins."""
    merged: dict[str, dict[str, Any]] = {}
    for directory in directories:
        path = directory / RESULTS if directory.is_dir() else directory
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        for line in path.read_text().splitlines():
            if line.strip():
                result = json.loads(line)
                merged[result["id"]] = result
    return list(merged.values())
