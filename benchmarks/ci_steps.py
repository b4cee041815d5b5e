"""Benchmark: how long each step of `.ci/run` takes, and the default lane (install, lint, pytest) against the
extra lanes (megatron-core 0.12.1, emulated NPU).

Prints figures; asserts nothing. Either runs `.ci/run` itself (its output is kept in --log) or reads the output of
an earlier run. `.ci/run` prints `=== <step>  [<seconds since start>s]` before each step; a step lasts until the
next marker.

    python benchmarks/ci_steps.py                 # runs bash .ci/run (CI=true), then prints the table
    python benchmarks/ci_steps.py --from LOG      # the table for a saved .ci/run output
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^=== (?P<name>.+?)\s+\[(?P<at>\d+)s\]\s*$")
EXTRA_LANES = ("megatron-core 0.12.1 lane", "verl lane", "emulated NPU lane")
"""Steps that are not the default lane: each lane's time is reported against its own budget."""


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    started_s: int
    seconds: int

    @property
    def lane(self) -> str:
        return "extra" if any(lane in self.name for lane in EXTRA_LANES) else "default"


def steps_of(text: str, total_s: int | None = None) -> list[Step]:
    """Steps from `.ci/run` output; the last one ends at total_s (or at the 'all green' marker)."""
    marks = [(m["name"], int(m["at"])) for line in text.splitlines() if (m := MARKER.match(line))]
    ends = [at for _, at in marks[1:]] + [total_s if total_s is not None else marks[-1][1]]
    return [Step(name, at, end - at) for (name, at), end in zip(marks, ends, strict=True) if name != "all green"]


def run_ci(log: Path) -> tuple[str, int, int]:
    """bash .ci/run with its output teed to log; (output, seconds, exit code)."""
    started = time.monotonic()
    with log.open("w") as sink:
        proc = subprocess.Popen(["bash", ".ci/run"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "CI": "true"})
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sink.write(line)
            sink.flush()
        code = proc.wait()
    return log.read_text(), round(time.monotonic() - started), code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="log_in", type=Path, help="a saved .ci/run output to read instead of running")
    parser.add_argument("--log", type=Path, default=Path("ci-run.log"), help="where a run's output is kept")
    args = parser.parse_args()
    if args.log_in:
        text, total, code = args.log_in.read_text(), None, None
    else:
        text, total, code = run_ci(args.log)
    steps = steps_of(text, total)
    if not steps:
        raise SystemExit("no '=== step [Ns]' markers found: is this the output of .ci/run?")
    print()
    print(tabulate([(s.name, s.lane, s.started_s, s.seconds) for s in steps],
                   headers=["step", "lane", "start s", "seconds"]))
    for lane in ("default", "extra"):
        seconds = sum(s.seconds for s in steps if s.lane == lane)
        print(f"{lane} lane: {seconds} s ({seconds / 60:.1f} min)")
    if code is not None:
        print(f".ci/run exit code {code}, {total} s in all")


if __name__ == "__main__":
    main()
