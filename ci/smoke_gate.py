#!/usr/bin/env python3
"""The smoke gate of ONE stack: a stack's strict and big lanes run only when that stack's smoke lane passed, so a
failure on one stack (an image that moved, a pairing that broke) never cancels the other's lanes. Reads the smoke
leg's own results (its parity-out artifact), with the standard library only (it runs on the image's python3, before
the harness is installed).

    python3 ci/smoke_gate.py DIR STACK     DIR: the smoke leg's out dir (holding results.jsonl)

Exit 0: every smoke row of the stack PASSed (a `broken:` row's SKIP aside); 1: a row did not, or the smoke leg
left no results (it failed before running), each named.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def problems(folder: Path) -> list[str]:
    results = folder / "results.jsonl"
    if not results.is_file():
        return [f"no {results}: the smoke leg ended before it ran its rows (its log says why)"]
    found, rows = [], 0
    for line in filter(str.strip, results.read_text().splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            found.append("results.jsonl holds a cut-off line: the smoke leg was killed")
            continue
        rows += 1
        verdict = row.get("verdict")
        broken = verdict == "SKIP" and any(str(r).startswith("broken") for r in row.get("reasons") or [])
        if verdict != "PASS" and not broken:
            found.append(f"{row.get('id')}: {verdict} ({'; '.join(map(str, row.get('reasons') or []))[:200]})")
    if rows == 0:
        found.append("the smoke leg wrote no rows")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 ci/smoke_gate.py DIR STACK", file=sys.stderr)
        return 2
    folder, stack = Path(argv[0]), argv[1]
    found = problems(folder)
    for problem in found:
        print(f"::error title=smoke ({stack}) did not pass::{problem}")
    if found:
        print(f"smoke ({stack}) did not pass: this stack's lanes do not run; the other stack's are not held back")
        return 1
    print(f"smoke ({stack}) passed: its lanes run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
