"""results.jsonl: one strict JSON line per scenario, appended as each finishes so a crash loses nothing.

Strict JSON (RFC 8259 has no NaN or Infinity; jq and most readers reject them): a non-finite number is written as
null and its path goes in the line's `non_finite` map ({"metrics.logprob_max_abs": "nan"}), from which `load`
puts it back, so a NaN metric still reads as NaN, never as missing. A line cut off by a crash or a full disk is
skipped with a warning when it is the file's last line, and an error naming the file and line elsewhere."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from parity.harness.config.paths import RESULTS

NON_FINITE = "non_finite"
"""Key of the map path -> 'nan' / 'inf' / '-inf' of the values written as null."""


def _strict(value: Any, path: str, found: dict[str, str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found[path] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return None
    if isinstance(value, dict):
        return {key: _strict(item, f"{path}.{key}" if path else str(key), found) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(item, f"{path}.{i}", found) for i, item in enumerate(value)]
    return value


def dumps(result: dict[str, Any]) -> str:
    """One line of strict JSON (non-finite numbers as null, listed under `non_finite`)."""
    found: dict[str, str] = {}
    data = _strict({k: v for k, v in result.items() if k != NON_FINITE}, "", found)
    if found:
        data[NON_FINITE] = found
    return json.dumps(data, default=str, allow_nan=False)


def _restore(data: dict[str, Any]) -> dict[str, Any]:
    for path, text in (data.pop(NON_FINITE, None) or {}).items():
        *parents, last = path.split(".")
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.get(key)
            if node is None:
                break
        else:
            if isinstance(node, list):
                node[int(last)] = float(text)
            elif isinstance(node, dict):
                node[last] = float(text)
    return data


def loads(line: str) -> dict[str, Any]:
    return _restore(json.loads(line))


def append(out_dir: Path, result: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    line = dumps(result) + "\n"
    with open(out_dir / RESULTS, "a") as handle:
        handle.write(line)
        handle.flush()


def reset(out_dir: Path) -> None:
    (out_dir / RESULTS).unlink(missing_ok=True)


def read(path: Path) -> list[dict[str, Any]]:
    """The results of one file, in order. A last line that is cut off (no newline, or not JSON) is skipped with
    a warning on stderr: the run that wrote it was killed mid-write. A bad line elsewhere is an error."""
    text = path.read_text()
    lines = text.splitlines()
    results = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            result = loads(line)
            if not isinstance(result, dict) or "id" not in result or "verdict" not in result:
                raise ValueError("not a result (no id or verdict)")
        except (ValueError, AttributeError, IndexError, KeyError) as exc:
            if number == len(lines):
                print(f"parity: warning: {path} line {number} is cut off (a run killed mid-write?); skipped: "
                      f"{exc}", file=sys.stderr)
                continue
            raise ValueError(f"{path} line {number}: {exc}") from None
        results.append(result)
    return results


#: the upstream projects a row can run from a release or a source tree (provenance keys)
UPSTREAM = ("verl", "mindspeed", "megatron_lm")


def upstream_label(result: dict[str, Any]) -> str:
    """The upstream stack a row ran on, stable from night to night: each upstream project's version, and "tree"
    where it ran from a source tree (PARITY_VERL_SRC, a MindSpeed or Megatron-LM clone) rather than a release."""
    provenance = result.get("provenance") or {}
    parts = []
    for name in UPSTREAM:
        info = provenance.get(name)
        if isinstance(info, dict) and (info.get("version") or info.get("commit")):
            tree = info.get("source") not in (None, "installed package") or bool(info.get("tree"))
            parts.append(f"{name.replace('_', '-')} {info.get('version') or '?'}{' tree' if tree else ''}")
    return ", ".join(parts)


def load(directories: list[Path]) -> list[dict[str, Any]]:
    """Results of several shards, merged; a later line for the same id on the same upstream stack wins. The same
    row run on two stacks (the nightly's verl lanes: verl's release and its main branch) is two rows, side by side,
    each id followed by its stack in brackets."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for directory in directories:
        path = directory / RESULTS if directory.is_dir() else directory
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        for result in read(path):
            merged[(result["id"], upstream_label(result))] = result
    by_id: dict[str, list[tuple[str, dict[str, Any]]]] = {}  # first appearance order, a row's stacks together
    for (run_id, stack), result in merged.items():
        by_id.setdefault(run_id, []).append((stack, result))
    return [result if len(runs) == 1 else {**result, "id": f"{run_id} [{stack}]"}
            for run_id, runs in by_id.items() for stack, result in runs]
