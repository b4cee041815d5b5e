"""The commands that check or rewrite files: golden verify, golden diff, migrate."""

from __future__ import annotations

import argparse
from pathlib import Path

from tabulate import tabulate

from parity.harness.config.errors import ScenarioError
from parity.harness.config.migrate import migrate_file
from parity.harness.session import EXIT_FAILED, EXIT_OK

# parity.harness.judge.golden imports torch: each command imports it when it runs (`parity --help` and a bad
# argument exit without it)


def cmd_golden_verify(args: argparse.Namespace) -> int:
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
    return EXIT_FAILED if problems else EXIT_OK


def cmd_golden_diff(args: argparse.Namespace) -> int:
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
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    stale = 0
    for name in args.files:
        changes = migrate_file(Path(name), write=not args.check)
        stale += bool(changes)
        verb = "uses old names" if args.check else "migrated"
        for change in changes:
            print(f"{name}: {change.path}: {change.old} -> {change.new}")
        print(f"{name}: {verb} ({len(changes)} changes)" if changes else f"{name}: up to date")
    return EXIT_FAILED if (args.check and stale) else EXIT_OK
