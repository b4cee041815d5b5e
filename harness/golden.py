"""`parity golden record|verify|diff`: make a set of goldens on the reference device (a GPU runner:
.github/workflows/goldens.yml), prove a downloaded set is the pinned one, and show what changed between two sets."""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
from pathlib import Path

from tabulate import tabulate

from parity.harness.config.errors import ScenarioError
from parity.harness.config.paths import slug
from parity.harness.config.selection import check_runnable, scenario_files, select
from parity.harness.config.validate import skip_reason
from parity.harness.options import RunOptions, writable_out_dir

# parity.harness.judge.golden and the runner import torch: each command imports what it uses (`parity --help`
# and a bad argument exit without it)


def cmd_record(args: argparse.Namespace) -> int:
    from parity.harness.judge import golden
    from parity.harness.runner import Runner, harness_commit

    scenarios = select(scenario_files(args.files), args.k, args.device)
    if not scenarios:
        raise ScenarioError(f"no scenario matches -k {args.k!r}" if args.k else "the files hold no scenarios")
    check_runnable(scenarios)
    out = Path(args.out)
    writable_out_dir(out)
    runner = Runner(RunOptions(out_dir=out, cache_dir=Path(args.cache_dir)), scenarios)
    recorded: dict[str, str] = {}
    failed = 0
    for scenario in scenarios:
        if reason := skip_reason(scenario):
            print(f"SKIP  {scenario.id}: {reason}")
            continue
        directory = out / slug(scenario.id)
        record = runner.execute(scenario, scenario.id, directory)
        if not record.ok:
            failed += 1
            print(f"ERROR {scenario.id}: {record.error}")
            shutil.rmtree(directory, ignore_errors=True)  # a golden set never holds a failed run
            continue
        recorded[scenario.id] = directory.name
        print(f"OK    {scenario.id} -> {directory}")
    path = golden.write_manifest(out, recorded, {"harness_commit": harness_commit(), "device": args.device,
                                                 "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
    print(f"{len(recorded)} goldens, manifest: {path}")
    return 1 if failed or not recorded else 0


def cmd_verify(args: argparse.Namespace) -> int:
    from parity.harness.judge import golden

    root = Path(args.dir)
    try:
        problems = golden.verify(root)
        if args.sha256 and (actual := golden.sha256(root / golden.MANIFEST)) != args.sha256:
            problems.insert(0, f"{root / golden.MANIFEST} has sha256 {actual}, the pin says {args.sha256}")
    except (OSError, ValueError, KeyError) as exc:
        raise ScenarioError(f"cannot verify {root}: {exc}") from None
    for problem in problems:
        print(problem)
    print(f"{root}: {'NOT the pinned goldens' if problems else 'verified against its manifest'}")
    return 1 if problems else 0


def cmd_diff(args: argparse.Namespace) -> int:
    from parity.harness.judge import golden

    try:
        deltas, only = golden.diff(Path(args.old), Path(args.new))
    except (OSError, ValueError, KeyError) as exc:
        raise ScenarioError(f"cannot compare goldens: {exc}") from None
    if deltas:
        headers = ["id", *deltas[0].metrics]
        rows = [[d.run_id, *(f"{v:+.3g}" if "change" in k else f"{v:.3g}" for k, v in d.metrics.items())]
                for d in deltas]
        print(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
    for line in only:
        print(line)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("golden", help="record goldens on the reference device, verify a set, diff two sets")
    verbs = parser.add_subparsers(dest="golden", required=True)
    rec = verbs.add_parser("record", help="run scenarios and keep their records as goldens with a manifest")
    rec.add_argument("files", nargs="*")
    rec.add_argument("-k")
    rec.add_argument("--device", choices=["cpu", "cuda", "npu"], default="cuda")
    rec.add_argument("--out", required=True, help="directory of the golden set (one record dir per scenario)")
    rec.add_argument("--cache-dir", default=".parity-cache")
    rec.set_defaults(func=cmd_record)
    ver = verbs.add_parser("verify", help="check a (downloaded) golden set against its manifest's hashes")
    ver.add_argument("dir")
    ver.add_argument("--sha256", help="the pinned sha256 of manifest.json itself")
    ver.set_defaults(func=cmd_verify)
    dif = verbs.add_parser("diff", help="metric deltas between two golden sets")
    dif.add_argument("old")
    dif.add_argument("new")
    dif.set_defaults(func=cmd_diff)
