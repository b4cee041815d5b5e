"""`parity` command line: run, list, report (and plan / migrate for Ascend users).

Exit codes: 0 nothing failed; 1 a scenario FAILed or ERRORed; 2 bad input (never a traceback).
Importing this module imports neither torch nor matplotlib: each command imports the runner, the judge or the
report pages when it gets to them, so `--help`, `list` and bad input answer in a fraction of a second, and
`run` starts the forkserver's imports before its own.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tabulate import tabulate

from parity.harness import calibrate, golden, plan
from parity.harness.config import migrate
from parity.harness.config.errors import ScenarioError
from parity.harness.config.selection import DEFAULT_FILES, check_runnable, scenario_files, select
from parity.harness.config.shard import Shard, split
from parity.harness.config.validate import skip_reason
from parity.harness.options import add_options, run_options, writable_out_dir
from parity.harness.run.launch import Interrupted, start_forkserver
from parity.harness.run.preload import forkserver_preload
from parity.reports import history
from parity.reports import results as results_file
from parity.reports.progress import RunProgress
from parity.reports.terminal import print_report

if TYPE_CHECKING:
    from parity.harness.judge.verdict import Verdict

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def cmd_run(args: argparse.Namespace) -> int:
    scenarios = select(scenario_files(args.files), args.k, args.device)
    if not scenarios:
        raise ScenarioError(f"no scenario matches -k {args.k!r}" if args.k else "the files hold no scenarios")
    if args.shard:
        shard = Shard.parse(args.shard)
        total, scenarios = len(scenarios), split(scenarios, shard)
        print(f"shard {shard.index}/{shard.count}: {len(scenarios)} of {total} scenarios", flush=True)
    check_runnable(scenarios)
    options = run_options(lambda name: getattr(args, name))
    writable_out_dir(options.out_dir)
    results_file.reset(options.out_dir)
    if options.forks_here(scenarios):
        start_forkserver(*forkserver_preload(scenarios))
    from parity.harness.runner import Runner
    from parity.reports.early_figures import EarlyFigures
    from parity.reports.publish import publish

    runner = Runner(options, scenarios)
    started = time.perf_counter()
    collected: list[dict] = []
    early = EarlyFigures()

    def on_result(verdict: Verdict) -> None:
        result = verdict.to_json()
        if not any(r["id"] == result["id"] for r in collected):  # a scenario whose report failed comes twice
            collected.append(result)
            progress.finished(result)
        early.submit(result)
        results_file.append(options.out_dir, result)

    print(f"running {len(scenarios)} scenarios -> {options.out_dir}/", flush=True)
    try:
        try:
            with RunProgress(len(scenarios)) as progress:
                runner.run(scenarios, on_result)
        except Interrupted as exc:  # the running scenario is recorded as ERROR; report what finished, exit 128+N
            publish(options.out_dir, collected, time.perf_counter() - started, early=early, history=options.history)
            print(f"parity: {exc}", file=sys.stderr)
            return 128 + exc.signum
        publish(options.out_dir, collected, time.perf_counter() - started, early=early, history=options.history)
    except OSError as exc:  # the out dir stopped taking writes (disk full, removed): say so, show what finished
        runner.close()
        early.figures([])  # stops the background figure worker: there is no page to draw for
        print_report(collected, time.perf_counter() - started)
        raise ScenarioError(f"--out {options.out_dir}: cannot write the results: {exc}") from None
    return EXIT_FAILED if any(r["verdict"] in ("FAIL", "ERROR") for r in collected) else EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    scenarios = select(scenario_files(args.files), args.k, args.device)
    for scenario in scenarios:
        marks = ",".join(scenario.marks)
        reason = skip_reason(scenario) if args.why else None
        print(f"{scenario.id}  [{marks}]" + (f"  SKIP: {reason}" if reason else ""))
    print(f"{len(scenarios)} scenarios", file=sys.stderr)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from parity.reports.publish import publish

    try:
        merged = results_file.load([Path(d) for d in args.dirs])
    except (FileNotFoundError, ValueError) as exc:
        raise ScenarioError(f"cannot read results: {exc}") from None
    out = Path(args.out)
    writable_out_dir(out)
    if out.resolve() not in [Path(d).resolve() for d in args.dirs]:
        results_file.reset(out)
        for result in merged:
            results_file.append(out, result)
    publish(out, merged, page=args.html)
    return EXIT_FAILED if any(r["verdict"] in ("FAIL", "ERROR") for r in merged) else EXIT_OK


def cmd_engines(args: argparse.Namespace) -> int:
    """The engine specs: what each built-in engine implements, reads and needs, and whether it can run here."""
    from tabulate import tabulate

    from parity.harness.config.registry import SPECS, check_environment

    rows = []
    for spec in SPECS.values():
        problems = spec.missing() or [p for p in [check_environment(spec)] if p]
        rows.append([spec.name, ", ".join(spec.aliases) or "-", " ".join(sorted(spec.dims)) or "one rank",
                     ", ".join(spec.kwargs_blocks) or "-", ",".join(spec.devices),
                     "; ".join(r.module + (f" {r.versions}" if r.versions else "") for r in spec.requires) or "-",
                     "yes" if not problems else "no: " + "; ".join(problems)])
    print(tabulate(rows, headers=["engine", "aliases", "layout dims", "kwargs", "devices", "requires", "runs here"],
                   tablefmt="simple", maxcolwidths=[None, None, 24, None, None, 30, 40]))
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    try:
        runs = history.load_runs([Path(d) for d in args.dirs])
    except (FileNotFoundError, ValueError) as exc:
        raise ScenarioError(f"cannot read results: {exc}") from None
    print(tabulate(history.trend_table(runs), headers=history.HEADERS, tablefmt="simple", disable_numparse=True))
    flags = history.detect(runs)
    print(f"\n{len(runs)} runs, oldest first: {', '.join(run.label for run in runs)}")
    for flag in flags:
        print(flag.line())
    print(f"{len(flags)} change(s) flagged" if flags else "no change flagged")
    if args.html:
        from parity.reports import html

        writable_out_dir(Path(args.out))
        page = html.render(list(runs[-1].results.values()), title=f"Parity history: {runs[-1].label}",
                           trends=history.trend_figures(runs, flags), drift=[flag.line() for flag in flags])
        print(f"report: {html.write(Path(args.out), page)}")
    return EXIT_FAILED if flags else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity", description="Backend-parity harness for LLM training engines.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios and judge them against their references")
    run.add_argument("files", nargs="*", help=f"scenario YAML files (default: {DEFAULT_FILES[0]})")
    run.add_argument("-k", help="select scenario ids: substrings with and / or / not")
    add_options(run.add_argument)
    run.set_defaults(func=cmd_run)
    lst = sub.add_parser("list", help="list expanded scenario ids with their marks")
    lst.add_argument("files", nargs="*")
    lst.add_argument("-k")
    lst.add_argument("--device", choices=["cpu", "cuda", "npu"])
    lst.add_argument("--why", action="store_true", help="also say why a scenario would be skipped here")
    lst.set_defaults(func=cmd_list)
    rep = sub.add_parser("report", help="re-render and merge results.jsonl of one or more out dirs (shards)")
    rep.add_argument("dirs", nargs="+")
    rep.add_argument("--out", default="parity-report")
    rep.add_argument("--html", action="store_true", help="also write OUT/report.html (tables, plots; one file)")
    rep.set_defaults(func=cmd_report)
    his = sub.add_parser("history", help="trends over earlier runs' out dirs and the changes in them (exit 1 if any)")
    his.add_argument("dirs", nargs="+", help="out dirs of earlier runs (results.jsonl), any order")
    his.add_argument("--html", action="store_true", help="also write OUT/report.html with trend charts")
    his.add_argument("--out", default="parity-history")
    his.set_defaults(func=cmd_history)
    eng = sub.add_parser("engines", help="the engine specs: layout dims, kwargs, devices, requirements here")
    eng.set_defaults(func=cmd_engines)
    plan.add_parser(sub)
    calibrate.add_parser(sub)
    golden.add_parser(sub)
    migrate.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ScenarioError as exc:
        print(f"parity: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
