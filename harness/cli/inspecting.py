"""The commands that look without running: list, engines, plan, history."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tabulate import tabulate

from parity.harness.config.errors import ScenarioError
from parity.harness.config.selection import scenario_files, select
from parity.harness.config.validate import skip_reason
from parity.harness.options import writable_out_dir
from parity.harness.plan import plan_scenario, render
from parity.harness.session import EXIT_FAILED, EXIT_OK
from parity.reports import history


def cmd_list(args: argparse.Namespace) -> int:
    scenarios = select(scenario_files(args.files), args.k, args.device)
    for scenario in scenarios:
        marks = ",".join(scenario.marks)
        reason = skip_reason(scenario) if args.why else None
        print(f"{scenario.id}  [{marks}]" + (f"  SKIP: {reason}" if reason else ""))
    print(f"{len(scenarios)} scenarios", file=sys.stderr)
    return EXIT_OK


def cmd_engines(args: argparse.Namespace) -> int:
    """The engine specs: what each built-in engine implements, reads and needs, and whether it can run here."""
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


def cmd_plan(args: argparse.Namespace) -> int:
    for scenario in select(scenario_files(args.files), args.k, args.device):
        plans = plan_scenario(scenario, scenario.source or "", Path(args.out), args.master_addr, args.master_port)
        print(render(scenario, plans))
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    try:
        runs = history.load_runs([Path(d) for d in args.dirs])
    except (FileNotFoundError, ValueError) as exc:
        raise ScenarioError(f"cannot read results: {exc}") from None
    print(tabulate(history.trend_table(runs), headers=history.HEADERS, tablefmt="simple", disable_numparse=True))
    flags, matrix = history.detect(runs), history.detect_matrix(runs)
    print(f"\n{len(runs)} runs, oldest first: {', '.join(run.label for run in runs)}")
    lines = [flag.line() for flag in [*matrix, *flags]]
    for line in lines:
        print(line)
    print(f"{len(lines)} change(s) flagged" if lines else "no change flagged")
    if args.html:
        from parity.reports import html

        writable_out_dir(Path(args.out))
        page = html.render(list(runs[-1].results.values()), title=f"Parity history: {runs[-1].label}",
                           trends=history.trend_figures(runs, flags), drift=lines)
        print(f"report: {html.write(Path(args.out), page)}")
    return EXIT_FAILED if lines else EXIT_OK
