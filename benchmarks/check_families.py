"""Shared by false_fail_load.py and margins.py: the checks of a results.jsonl line grouped into metric families
(`layer 2 self_attn.q_norm grad norm rel diff` -> `group grad norm rel diff`), each with its observed value and
limit, so spreads and margins are computed from what the verdict actually compared."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from parity.harness.config.paths import RESULTS
from parity.reports import results as results_file

_LAYER = re.compile(r"^layer \d+ \S+ grad norm")
_TOP_GROUP = re.compile(r"^(embed_tokens|norm|lm_head) grad norm")
_LOAD = re.compile(r"^layer \d+ \S+ expert load")


def family(metric: str) -> str:
    metric = _LAYER.sub("group grad norm", metric)
    metric = _LOAD.sub("expert load", metric)
    return _TOP_GROUP.sub("group grad norm", metric)


def results(paths: list[Path]) -> Iterator[dict]:
    for path in paths:
        yield from results_file.read(path / RESULTS if path.is_dir() else path)


def checks_by_family(result: dict) -> dict[str, list[tuple[float, float]]]:
    """family -> [(observed, limit)] of one scenario's checks, plus the bf16/fp16 lower bound (observed is the
    before-training max |Δ|, limit the bound: a margin there is observed / limit)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for check in result.get("checks", []):
        out.setdefault(family(check["metric"]), []).append((float(check["observed"]), float(check["limit"])))
    return out
