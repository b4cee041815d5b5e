"""`parity calibrate FILE [-k] --seeds N`: run clean scenarios over N workload seeds, write the measured error
distribution and proposed limits (worst x margin) per metric to OUT/calibration.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from parity.harness.config.errors import ScenarioError
from parity.harness.config.selection import scenario_files, select
from parity.harness.contract.schema import Scenario
from parity.harness.judge.calibrate import band_proposals, distribution, proposals, step_envelopes
from parity.harness.options import RunOptions


def seeded(scenarios: list[Scenario], seeds: int) -> list[Scenario]:
    """Every clean scenario (no faults) once per seed 0..seeds-1."""
    clean = [s for s in scenarios if not s.faults]
    return [s.model_copy(update={"workload": s.workload.model_copy(update={"seed": seed})})
            for seed in range(seeds) for s in clean]


def cmd_calibrate(args: argparse.Namespace) -> int:
    scenarios = seeded(select(scenario_files(args.files), args.k, None), args.seeds)
    if not scenarios:
        raise ScenarioError("no clean scenario to calibrate on")
    from parity.harness.runner import Runner  # torch: only once there is something to run

    out = Path(args.out)
    runner = Runner(RunOptions(out_dir=out, cache_dir=Path(args.cache_dir)), scenarios)
    verdicts = runner.run(scenarios, lambda v: print(f"{v.status:<5} {v.id}", flush=True))
    judged = [v for v in verdicts if v.status in ("PASS", "FAIL")]
    dist = distribution([v.metrics for v in judged])
    envelopes = step_envelopes([v.to_json() for v in judged])
    report = {"runs": len(verdicts), "false_fails": [v.id for v in verdicts if v.status == "FAIL"],
              "errors": [v.id for v in verdicts if v.status == "ERROR"], "margin": args.margin,
              "distribution": dist, "proposed_limits": proposals(dist, args.margin),
              "step_envelopes": envelopes, "band_margin": args.band_margin,
              "proposed_bands": band_proposals(envelopes, args.band_margin)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(report, indent=1))
    for name, stats in dist.items():
        print(f"{name:<18} worst {stats['worst']:.3g}  p90 {stats['p90']:.3g}  median {stats['median']:.3g}  "
              f"-> proposed limit {report['proposed_limits'][name]:.3g}")
    for dtype, bands in report["proposed_bands"].items():  # the per-step growth a long run's limits take
        print(f"band [{dtype}] " + "  ".join(f"{name} {slope:.3g}" for name, slope in bands.items()))
    print(f"{len(report['false_fails'])} FAIL on clean runs (must be 0); written {out / 'calibration.json'}")
    return 1 if report["false_fails"] or report["errors"] else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("calibrate", help="measure clean error over seeds and propose limits")
    parser.add_argument("files", nargs="*")
    parser.add_argument("-k")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--margin", type=float, default=10.0, help="proposed limit = worst clean value x margin")
    parser.add_argument("--band-margin", type=float, default=3.0,
                        help="a long run's band covers the worst clean value of every step x this")
    parser.add_argument("--out", default="parity-calibration")
    parser.add_argument("--cache-dir", default=".parity-cache")
    parser.set_defaults(func=cmd_calibrate)
