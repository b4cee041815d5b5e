"""`parity bisect`: the first bad upstream commit for a scenario (harness/bisect.py), given its commits or, for the
nightly, for every row that flipped PASS -> FAIL while its upstream source tree moved."""

from __future__ import annotations

import argparse
from pathlib import Path

from parity.harness.config import paths
from parity.harness.config.errors import ScenarioError
from parity.harness.config.selection import scenario_files, select
from parity.harness.session import EXIT_FAILED, EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    from parity.harness.bisect import PROJECTS

    bisect = sub.add_parser("bisect", help="find the first bad commit of an upstream project (verl, MindSpeed, "
                                           "Megatron-LM) for a scenario, or for the rows a nightly saw flip")
    bisect.add_argument("files", nargs="*", help="scenario YAML files holding the scenario")
    bisect.add_argument("-k", help="the scenario's id (exactly one row)")
    bisect.add_argument("--project", choices=sorted(PROJECTS))
    bisect.add_argument("--repo", help="a git clone of the project holding both commits")
    bisect.add_argument("--good", help="a commit the scenario PASSes at")
    bisect.add_argument("--bad", help="a later commit it FAILs at")
    bisect.add_argument("--out", default="parity-bisect", help="where bisect.json goes (with --flipped: RUN_DIR)")
    bisect.add_argument("--timeout", type=float, default=1800, help="seconds one run of the scenario may take")
    bisect.add_argument("--cache-dir", default=str(paths.CACHE), help="the reference cache the runs share")
    bisect.add_argument("--flipped", metavar="RUN_DIR",
                        help="bisect every row of RUN_DIR that PASSed in --history and FAILs now while its source "
                             "tree's commit moved; then publish RUN_DIR's report again with the answers")
    bisect.add_argument("--history", metavar="PREV_DIR", help="the previous night's out dir (with --flipped)")
    bisect.set_defaults(func=cmd_bisect)


def cmd_bisect(args: argparse.Namespace) -> int:
    from parity.harness import bisect

    if args.flipped:
        return _flipped(Path(args.flipped), args.history, args.timeout, Path(args.cache_dir))
    missing = [f"--{name}" for name in ("project", "repo", "good", "bad") if not getattr(args, name)]
    if missing or not args.k:
        raise ScenarioError(f"parity bisect needs {', '.join(missing + ([] if args.k else ['-k ID']))} "
                            "(or --flipped RUN_DIR --history PREV_DIR)")
    files = [str(p) for p in scenario_files(args.files)]
    run_id = _one_row(files, args.k)
    repo = Path(args.repo)
    result = bisect.bisect(args.project, repo, args.good, args.bad, files, run_id, args.timeout, Path(args.cache_dir))
    print(result.line())
    print(f"written: {bisect.write(Path(args.out), [result])}")
    return EXIT_OK if result.first_bad else EXIT_FAILED


def _one_row(files: list[str], k: str) -> str:
    rows = select([Path(f) for f in files], k, None)
    exact = [s for s in rows if s.id == k]
    if exact:
        return exact[0].id
    if len(rows) != 1:
        named = ", ".join(s.id for s in rows[:5]) or "none"
        raise ScenarioError(f"-k {k} selects {len(rows)} scenarios in {', '.join(files)} ({named}); bisect needs one")
    return rows[0].id


def _flipped(run_dir: Path, history: str | None, timeout_s: float, cache_dir: Path) -> int:
    from parity.harness import bisect
    from parity.reports import results as results_file
    from parity.reports.publish import publish

    if not history:
        raise ScenarioError("--flipped needs --history PREV_DIR (the previous night's out dir)")
    for directory in (run_dir, Path(history)):
        if not (directory / paths.RESULTS).is_file():
            raise ScenarioError(f"{directory}: no {paths.RESULTS} there (a run's --out directory)")
    current = results_file.load([run_dir])
    answers = []
    for row, project, tree, good, bad in bisect.flipped(results_file.load([Path(history)]), current):
        source = row.get("source")
        if not source:
            print(f"{row['id']}: no scenario file recorded, not bisected")
            continue
        print(f"bisecting {row['id']} over {project.name} {good[:10]}..{bad[:10]} in {tree}")
        answers.append(bisect.bisect(project.name, Path(tree), good, bad, [str(source)], row["id"], timeout_s,
                                     cache_dir))
        print(answers[-1].line())
    bisect.write(run_dir, answers)
    publish(run_dir, current, history=(Path(history),))
    return EXIT_OK
