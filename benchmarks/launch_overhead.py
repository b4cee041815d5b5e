"""Benchmark: per-scenario launch overhead of the forked launcher vs one torchrun per scenario.

Prints figures; asserts nothing (speed goals are measured here, never in timed unit tests).

    python benchmarks/launch_overhead.py [--runs 6] [--world 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from parity.harness.contract.schema import Scenario
from parity.harness.runner import Runner, RunOptions

ROW = "{model: tiny-qwen3, strategy: fsdp2}"
"""The scenario measured (its layout and workload set below), as a scenarios/*.yaml row."""


def measure(launcher: str, runs: int, world: int, cache: Path) -> list[tuple[float, float]]:
    runner = Runner(RunOptions(out_dir=Path(tempfile.mkdtemp()), cache_dir=cache, launcher=launcher))
    figures = []
    for seed in range(runs):
        scenario = Scenario.model_validate({**yaml.safe_load(ROW), "layout": {"dp": world},
                                            "workload": {"seed": seed, "batch_size": 2 * world}})
        record = runner.execute(scenario, f"bench-{launcher}-{seed}", runner.options.out_dir / str(seed))
        if not record.ok:
            raise SystemExit(f"{launcher} run {seed} failed: {record.error}\n{record.log_tail}")
        figures.append((record.wall_time_s, record.compute_time_s))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp())
    print(f"{'launcher':<10} {'runs':>4} {'wall median s':>14} {'compute median s':>17} {'overhead median s':>18} "
          f"{'overhead max s':>15} {'first-run wall s':>17}")
    for launcher in ("forked", "torchrun"):
        started = time.perf_counter()
        figures = measure(launcher, args.runs, args.world, cache)
        overhead = [w - c for w, c in figures[1:]] or [figures[0][0] - figures[0][1]]
        print(f"{launcher:<10} {len(figures):>4} {statistics.median(w for w, _ in figures):>14.2f} "
              f"{statistics.median(c for _, c in figures):>17.2f} {statistics.median(overhead):>18.2f} "
              f"{max(overhead):>15.2f} {figures[0][0]:>17.2f}   (total {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
