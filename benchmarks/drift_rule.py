"""The drift rule (harness/judge/drift.py) on synthetic histories of a step time with Gaussian run-to-run noise:
how often a 10 % slowdown is flagged at the run it starts in, and how often 20 clean runs raise a false alarm.

    python benchmarks/drift_rule.py [--noise 0.02] [--trials 500]
"""

from __future__ import annotations

import argparse
import random

from parity.harness.judge.drift import change_points

MARGIN = 0.05  # the step-time metric's margin in drift.METRICS


def rates(noise: float, trials: int, runs: int = 20, step: float = 0.10) -> dict[str, float]:
    rng = random.Random(0)
    hits = latest = false = spikes = 0
    for _ in range(trials):
        clean = [rng.gauss(1.0, noise) for _ in range(runs)]
        false += bool(change_points(clean, "up", MARGIN))
        spiked = [*clean[:runs // 2], 1.0 + 10 * noise, *clean[runs // 2 + 1:]]
        spikes += any(c.index == runs // 2 for c in change_points(spiked, "up", MARGIN))
        at = runs - 5
        stepped = clean[:at] + [v * (1 + step) for v in clean[at:]]
        hits += any(c.index == at for c in change_points(stepped, "up", MARGIN))
        last = [*clean[:-1], clean[-1] * (1 + step)]
        latest += any(c.index == runs - 1 for c in change_points(last, "up", MARGIN))
    return {"10% slowdown 5 runs before the end, flagged at its run": hits / trials,
            "10% slowdown in the latest run only, flagged": latest / trials,
            f"one noisy run (+{10 * noise:.0%}) flagged as a change": spikes / trials,
            f"{runs} clean runs, any false alarm": false / trials}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", type=float, default=0.02, help="run-to-run noise, relative standard deviation")
    parser.add_argument("--trials", type=int, default=500)
    args = parser.parse_args()
    print(f"noise {args.noise:.1%} per run, {args.trials} synthetic histories each")
    for what, rate in rates(args.noise, args.trials).items():
        print(f"  {rate:6.1%}  {what}")


if __name__ == "__main__":
    main()
