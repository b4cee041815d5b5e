"""Benchmark: the default matrix (scenarios/cpu.yaml) run N times, each through `parity run` in a fresh process
(as independent CI runs are), counting false FAILs (every scenario there is clean: must be 0) and printing the
spread (min / median / max over runs of the worst value across scenarios) of each checked metric family, per
dtype lane.

    python benchmarks/false_fail_load.py [--runs 20] [--file scenarios/cpu.yaml] [-k EXPR] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from check_families import checks_by_family, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--file", default="scenarios/cpu.yaml")
    parser.add_argument("-k", default=None)
    parser.add_argument("--out", type=Path, default=None, help="keep each run's out dir under here (run1, run2..)")
    parser.add_argument("--reuse", action="store_true", help="summarise runs already in --out instead of rerunning")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="false-fail-load-"))
    worst: dict[str, list[float]] = {}
    false_fails: list[str] = []
    for run in range(1, args.runs + 1):
        run_dir = out / f"run{run}"
        command = [sys.executable, "-m", "parity.harness.cli", "run", args.file, "--out", str(run_dir)]
        if not (args.reuse and (run_dir / "results.jsonl").is_file()):
            subprocess.run(command + (["-k", args.k] if args.k else []), check=False, stdout=subprocess.DEVNULL)
        per_family: dict[str, float] = {}
        for result in results([run_dir]):
            if result["verdict"] not in ("PASS", "SKIP"):
                false_fails.append(f"run {run}: {result['id']} {result['verdict']}: {'; '.join(result['reasons'])}")
            for family, pairs in checks_by_family(result).items():
                name = f"{family} [{result.get('dtype', 'fp32')}]"
                per_family[name] = max([per_family.get(name, 0.0)] + [obs for obs, _ in pairs])
        for name, value in per_family.items():
            worst.setdefault(name, []).append(value)
        print(f"run {run}/{args.runs}: {len(false_fails)} false FAILs so far", flush=True)
    print(f"\n{args.runs} runs of {args.file} (out: {out}): {len(false_fails)} false FAIL/ERROR verdicts")
    for line in false_fails:
        print("  " + line)
    print(f"\n{'metric family (worst over scenarios, per run)':58} {'min':>9} {'median':>9} {'max':>9}")
    for name in sorted(worst):
        values = worst[name]
        print(f"{name:58} {min(values):9.3g} {statistics.median(values):9.3g} {max(values):9.3g}")


if __name__ == "__main__":
    main()
