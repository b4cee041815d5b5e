"""`parity`: the command line, one parser with every subcommand.

Exit codes: 0 nothing failed; 1 a scenario FAILed or ERRORed (or a check failed); 2 bad input (a message, never a
traceback); 128 + N after signal N. Importing this package imports neither torch nor matplotlib: each command
imports the runner, the judge or the report pages when it gets to them, so `--help`, `list` and bad input answer
at once, and `run` starts the forkserver's imports before its own.
"""

from __future__ import annotations

import argparse
import sys

from parity.harness.cli import bisecting, files, inspecting, running
from parity.harness.config import paths
from parity.harness.config.errors import ScenarioError
from parity.harness.config.selection import DEFAULT_FILES
from parity.harness.options import add_options
from parity.harness.plan import PLACEHOLDER_PORT
from parity.harness.session import EXIT_BAD_INPUT

DEVICES = ["cpu", "cuda", "npu"]


def _selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", help=f"scenario YAML files (default: {DEFAULT_FILES[0]})")
    parser.add_argument("-k", help="select scenario ids: substrings with and / or / not")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity", description="Backend-parity harness for LLM training engines.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run scenarios and judge them against their references")
    _selection(run)
    add_options(run.add_argument)
    run.add_argument("--nodes", type=int, default=None, metavar="N",
                     help="rehearse multi-node on this host: every selected row's ranks split over N torchrun "
                          "agents (layout.nodes = N; with --rdzv c10d, as verl's multi-node jobs rendezvous)")
    run.set_defaults(func=running.cmd_run)

    listing = sub.add_parser("list", help="list expanded scenario ids with their marks")
    _selection(listing)
    listing.add_argument("--device", choices=DEVICES)
    listing.add_argument("--why", action="store_true", help="also say why a scenario would be skipped here")
    listing.set_defaults(func=inspecting.cmd_list)

    report = sub.add_parser("report", help="re-render and merge results.jsonl of one or more out dirs (shards)")
    report.add_argument("dirs", nargs="+")
    report.add_argument("--out", default="parity-report")
    report.add_argument("--html", action="store_true", help="also write OUT/report.html (tables, plots; one file)")
    report.add_argument("--history", action="append", default=[], metavar="DIR",
                        help="an earlier run's out dir (repeat for more): the report says what changed since the "
                             "latest of them (versions, verdicts)")
    report.set_defaults(func=running.cmd_report)

    history = sub.add_parser("history", help="trends over earlier runs' out dirs and the changes in them (exit 1 "
                                             "if any)")
    history.add_argument("dirs", nargs="+", help="out dirs of earlier runs (results.jsonl), any order")
    history.add_argument("--html", action="store_true", help="also write OUT/report.html with trend charts")
    history.add_argument("--out", default="parity-history")
    history.set_defaults(func=inspecting.cmd_history)

    bisecting.add_parser(sub)

    engines = sub.add_parser("engines", help="the engine specs: layout dims, kwargs, devices, requirements here")
    engines.set_defaults(func=inspecting.cmd_engines)

    plan = sub.add_parser("plan", help="print what each scenario would launch, without running it")
    _selection(plan)
    plan.add_argument("--device", choices=DEVICES)
    plan.add_argument("--out", default=str(paths.OUT))
    plan.add_argument("--master-addr", default="$MASTER_ADDR", help="node 0's address (default: a placeholder)")
    plan.add_argument("--master-port", type=int, default=PLACEHOLDER_PORT)
    plan.set_defaults(func=inspecting.cmd_plan)

    calibrate = sub.add_parser("calibrate", help="measure clean error over seeds and propose limits")
    _selection(calibrate)
    calibrate.add_argument("--seeds", type=int, default=20)
    calibrate.add_argument("--margin", type=float, default=10.0, help="proposed limit = worst clean value x margin")
    calibrate.add_argument("--band-margin", type=float, default=3.0,
                           help="a long run's band covers the worst clean value of every step x this")
    calibrate.add_argument("--out", default="parity-calibration")
    calibrate.add_argument("--cache-dir", default=str(paths.CACHE))
    calibrate.set_defaults(func=running.cmd_calibrate)

    golden = sub.add_parser("golden", help="record goldens on the reference device, verify a set, diff two sets")
    verbs = golden.add_subparsers(dest="golden", required=True, metavar="VERB")
    record = verbs.add_parser("record", help="run scenarios and keep their records as goldens with a manifest")
    _selection(record)
    record.add_argument("--device", choices=DEVICES, default="cuda")
    record.add_argument("--out", required=True, help="directory of the golden set (one record dir per scenario)")
    record.add_argument("--cache-dir", default=str(paths.CACHE))
    record.set_defaults(func=running.cmd_golden_record)
    verify = verbs.add_parser("verify", help="check a (downloaded) golden set against its manifest's hashes")
    verify.add_argument("dir")
    verify.add_argument("--sha256", help="the pinned sha256 of manifest.json itself")
    verify.set_defaults(func=files.cmd_golden_verify)
    diff = verbs.add_parser("diff", help="metric deltas between two golden sets")
    diff.add_argument("old")
    diff.add_argument("new")
    diff.set_defaults(func=files.cmd_golden_diff)

    migrate = sub.add_parser("migrate", help="rewrite renamed strategy and kwargs names in scenario files")
    migrate.add_argument("files", nargs="+")
    migrate.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file uses old names")
    migrate.set_defaults(func=files.cmd_migrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ScenarioError as exc:
        print(f"parity: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
