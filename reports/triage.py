"""What every output shows of a row that did not pass, said once: an ERROR's first-dying rank's log tail (trimmed of
the collective library's reaction to the death) with its log's path, and lists cut with an explicit "… N more"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from parity.harness.run.deaths import COLLECTIVE_NOISE

NOISE = COLLECTIVE_NOISE

TAIL_LINES = 12
"""Log lines an ERROR shows after trimming (results.jsonl keeps 30 per log)."""
REASONS_SHOWN = 8
"""Reasons the terminal and summary.md list per row before "… N more" (the HTML section lists them all)."""


@dataclass(frozen=True, slots=True)
class RankLog:
    path: str
    """The first-dying rank's log (OUT/records/<slug>/rank<N>.log)."""
    lines: list[str]
    """Its last lines, the collective library's noise removed."""
    trimmed: int
    """How many noise lines were removed from the tail."""


def first_rank_log(result: dict[str, Any], keep: int = TAIL_LINES) -> RankLog | None:
    """The first log in an ERROR row's stored tail (the launcher puts the first-dying rank's first), trimmed;
    None when the row stored no tail."""
    tail = result.get("log_tail") or ""
    sections = re.split(r"^--- (.+)$", tail, flags=re.MULTILINE)
    if len(sections) < 3:
        return None
    path, body = sections[1].strip(), sections[2]
    lines = [line for line in body.splitlines() if line.strip()]
    kept = [line for line in lines if not NOISE.search(line)]
    return RankLog(path, kept[-keep:], len(lines) - len(kept))


def log_lines(result: dict[str, Any]) -> list[str]:
    """The rank log as text lines for the terminal and markdown: its path, then its trimmed tail."""
    log = first_rank_log(result)
    if log is None:
        return []
    noise = f" ({log.trimmed} collective-library line(s) left out)" if log.trimmed else ""
    empty = "" if log.lines else " (nothing in it: the rank died without a word)"
    return [f"log: {log.path}{noise}{empty}", *log.lines]


def where_line(result: dict[str, Any]) -> str | None:
    """Where a FAIL first left its reference: in the model (harness/judge/fingerprint.py) and, when `parity bisect`
    ran for it, in its upstream project's history; its first reason, in causal order (harness/judge/causal.py),
    says at which step."""
    if result.get("verdict") != "FAIL":
        return None
    parts = [((result.get("metrics") or {}).get("first_divergent") or {}).get("line"), result.get("bisect")]
    return " · ".join(p for p in parts if p) or None


def cut(items: list[str], shown: int) -> list[str]:
    """The first `shown` items, then "… N more" when there are more."""
    return items if len(items) <= shown else [*items[:shown], f"… {len(items) - shown} more"]
