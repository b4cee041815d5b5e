"""Benchmark: judge the clean runs a seed scan kept (`seed_scan.py --keep DIR --cache-dir CACHE`) again, with the
limits and checks of the code as it is now, without running anything.

How a limit or a new check is calibrated: scan once (minutes per seed), then re-judge as often as needed
(seconds). Prints the false FAILs (every kept run is clean: must be 0) and, per check, the worst observed ÷ limit
over all runs with the run it came from; asserts nothing.

    python benchmarks/rejudge.py --matrix scenarios/cpu.yaml -k bf16 --keep DIR --cache-dir CACHE
"""

from __future__ import annotations

import argparse
import math
import re
from collections import defaultdict
from pathlib import Path

from seed_scan import matrix_rows  # benchmarks/ is on sys.path when run as a script

from parity.harness.config.paths import RECORD, slug
from parity.harness.judge.reference import baseline_scenario
from parity.harness.judge.tolerances import DEFAULTS
from parity.harness.judge.verdict import PHASES, judge
from parity.harness.options import RunOptions
from parity.harness.run.records import RunRecord
from parity.harness.runner import Runner

LOWER_BOUNDS = {"log-prob before training max |Δ| (bf16)": DEFAULTS["bf16"].logprob_max_abs_min,
                "entropy before training max |Δ| (bf16)": DEFAULTS["bf16"].entropy_max_abs_min,
                "entropy before training median |Δ|, minus: an UPPER bound (bf16)":
                    -(DEFAULTS["bf16"].entropy_median_abs_max or 0.0),
                **{f"{label} median |Δ| ratio to baseline (bf16)": DEFAULTS["bf16"].ratio_median_min or 0.0
                   for label in PHASES.values()}}


def lower_bounded(verdict) -> dict[str, float | None]:
    """The values the bf16 lower bounds judge (verdict.precision_problems)."""
    metrics = verdict.metrics
    return {"log-prob before training max |Δ| (bf16)": (metrics.get("logprobs_before") or {}).get("max_abs"),
            "entropy before training max |Δ| (bf16)": (metrics.get("entropy_before") or {}).get("max_abs"),
            "entropy before training median |Δ|, minus: an UPPER bound (bf16)":
                -(metrics.get("entropy_before") or {}).get("median_abs", 0.0),
            **{f"{label} median |Δ| ratio to baseline (bf16)": (metrics.get(key) or {}).get("ratio_median")
               for key, label in PHASES.items()}}


def check_key(check) -> str:
    return check.metric + (f" @step{check.step}" if check.step else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--matrix", type=Path, required=True)
    parser.add_argument("-k", default=None)
    parser.add_argument("--keep", type=Path, required=True, help="the --keep DIR of seed_scan.py")
    parser.add_argument("--cache-dir", type=Path, required=True, help="the --cache-dir of seed_scan.py")
    parser.add_argument("--top", type=int, default=25, help="checks to list, nearest their limit first")
    args = parser.parse_args()
    runner = Runner(RunOptions(out_dir=args.keep, cache_dir=args.cache_dir))
    worst: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))
    least: dict[str, tuple[float, str]] = {}
    runs, fails = 0, []
    for seed_dir in sorted(args.keep.glob("seed*"), key=lambda p: int(re.sub(r"\D", "", p.name))):
        seed = int(seed_dir.name.removeprefix("seed"))
        for scenario in matrix_rows(args.matrix, args.k, seed):
            record_dir = seed_dir / slug(scenario.id)
            if not (record_dir / RECORD).is_file():
                continue
            reference = runner._reference(scenario)
            base = baseline_scenario(scenario)
            baseline = runner._cached(base, "baseline") if base is not None else None
            verdict = judge(scenario, RunRecord.load(record_dir), reference, baseline)
            runs += 1
            if verdict.status != "PASS":
                fails.append(f"seed {seed} {scenario.id}: {verdict.reasons[:3]}")
            for check in verdict.checks:
                share = check.observed / check.limit if check.limit else (math.inf if check.observed else 0.0)
                if not math.isfinite(share) or share > worst[check_key(check)][0]:
                    worst[check_key(check)] = (share, f"seed {seed} {scenario.id}")
            for name, value in lower_bounded(verdict).items():  # a floor: the least clean value is the margin
                if value is not None and value < least.get(name, (math.inf, ""))[0]:
                    least[name] = (value, f"seed {seed} {scenario.id}")
    print(f"{runs} clean runs judged again, {len(fails)} not PASS (false FAILs: must be 0)")
    for line in fails:
        print("  " + line)
    print("\nlower bounds (the precision checks): least clean value, its bound, and the run")
    for name, (value, where) in sorted(least.items()):
        print(f"  {value:9.3g}  {name:<58} bound {LOWER_BOUNDS[name]:.3g}  {where}")
    print("\nworst observed / limit per check:")
    for name, (share, where) in sorted(worst.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"  {share:6.3f}  {name:<58} {where}")


if __name__ == "__main__":
    main()
