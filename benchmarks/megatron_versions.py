"""Benchmark: do two megatron-core releases give the same numbers? Compares two `parity run` outputs scenario by
scenario and prints the largest difference.

Per scenario present in both: the verdicts, |Δ| between the two runs' max |Δ log-prob| vs the reference, the
largest |Δ| between their per-step losses and pre-clip grad norms, and — when each results.jsonl has its
`records/` beside it — the largest |Δ| between the saved per-token tensors (log-probs, entropy). 0 everywhere
means bit-identical. Prints figures; asserts nothing.

    parity run scenarios/cpu.yaml -k megatron --out /tmp/mc016-out        # in the megatron-core 0.16.1 venv
    parity run scenarios/cpu.yaml -k megatron --out /tmp/mc012-out        # in the 0.12.1 venv (/work/venv-mc012)
    python benchmarks/megatron_versions.py /tmp/mc016-out/results.jsonl /tmp/mc012-out/results.jsonl
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from tabulate import tabulate

from parity.harness.config.paths import TENSORS, record_dir
from parity.reports import results as results_file


def load(path: Path) -> dict[str, dict[str, Any]]:
    rows = results_file.read(path)
    return {row["id"]: row for row in rows}


def largest_gap(a: list[float] | None, b: list[float] | None) -> float:
    """max |a_i - b_i| over two per-step series (inf when their lengths differ, nan when a value is nan)."""
    if not a and not b:
        return 0.0
    if a is None or b is None or len(a) != len(b):
        return math.inf
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def tensor_gap(first: Path, second: Path) -> float | None:
    """max |Δ| over every tensor both records saved (None when either has none)."""
    if not (first.is_file() and second.is_file()):
        return None
    a, b = load_file(first), load_file(second)
    if a.keys() != b.keys():
        return math.inf
    gaps = [0.0]
    for key in a:
        if a[key].shape != b[key].shape:
            return math.inf
        gaps.append(float((a[key].double() - b[key].double()).abs().max()) if a[key].numel() else 0.0)
    return max(gaps)


def compare(first: Path, second: Path) -> tuple[list[list[Any]], float]:
    a, b = load(first), load(second)
    table, worst = [], 0.0
    for run_id in sorted(a.keys() & b.keys()):
        ma, mb = a[run_id].get("metrics", {}), b[run_id].get("metrics", {})
        logp = (abs(ma["logprob_max_abs"] - mb["logprob_max_abs"])
                if ma.get("logprob_max_abs") is not None and mb.get("logprob_max_abs") is not None else None)
        series_a, series_b = ma.get("series", {}), mb.get("series", {})
        loss = largest_gap(series_a.get("loss"), series_b.get("loss"))
        gnorm = largest_gap(series_a.get("grad_norm"), series_b.get("grad_norm"))
        tensors = tensor_gap(record_dir(first.parent, run_id) / TENSORS, record_dir(second.parent, run_id) / TENSORS)
        gaps = [g for g in (logp, loss, gnorm, tensors) if g is not None]
        row_worst = max(gaps, default=0.0)
        if not row_worst <= worst:  # a nan gap wins too
            worst = row_worst
        table.append([run_id, a[run_id]["verdict"], b[run_id]["verdict"], ma.get("logprob_max_abs"),
                      mb.get("logprob_max_abs"), logp, loss, gnorm, tensors])
    return table, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path, help="results.jsonl of one release")
    parser.add_argument("second", type=Path, help="results.jsonl of the other")
    args = parser.parse_args()
    table, worst = compare(args.first, args.second)
    print(tabulate(table, floatfmt=".3g", headers=[
        "id", "verdict A", "verdict B", "logp max|Δ| A", "logp max|Δ| B", "|A-B| logp", "|A-B| loss",
        "|A-B| gnorm", "|A-B| tensors"]))
    only = sorted(load(args.first).keys() ^ load(args.second).keys())
    if only:
        print(f"\nin one file only ({len(only)}): {', '.join(only)}")
    differ = sum(row[1] != row[2] for row in table)
    print(f"\n{len(table)} scenarios in both; {differ} with different verdicts; largest difference between the two "
          f"runs: {worst:.3g}" + (" (bit-identical)" if worst == 0.0 else ""))


if __name__ == "__main__":
    main()
