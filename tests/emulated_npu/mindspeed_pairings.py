#!/usr/bin/env python3
"""MindSpeed's branches as their own files describe them: the one source of the pairing table in docs/ascend.md.

    python -m tests.emulated_npu.mindspeed_pairings extract MIRROR [--data DIR]   # a git dir of Ascend/MindSpeed
    python -m tests.emulated_npu.mindspeed_pairings table [--data DIR]            # the table docs/ascend.md holds

`extract` writes, per branch of interest (every `<release>_core_r0.12.1`, `core_r0.14.0` on, `master`, `dev`), the
README lines that name its Megatron-LM release (version-table rows, the `git checkout` after `cd Megatron-LM`),
setup.py's version line and whether the tree has `mindspeed/fsdp`; master's README also gives the maintenance table
("MindSpeed 版本维护策略": 维护 = maintained, 停止维护 = unmaintained). `table` renders them through the engine's own
reader (parity.engines.mindspeed.env.declared_pairing), so the doc, the data and the pairing gate cannot disagree;
tests/unit/test_mindspeed_pairings.py checks the doc against the data and, where the mirror is on disk, the data
against the mirror.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from parity.engines.mindspeed.env import declared_pairing

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "mindspeed_branches"
#: the branches whose pairing matters to verl's images and this harness
BRANCH = re.compile(r"^(\d+\.\d+\.\d+_core_r0\.12\.1|core_r0\.(1[4-9]|[2-9]\d)\.\d+|master|dev)$")
_WANTED_ROW = re.compile(r"^\|\s*(Mcore版本|Megatron-LM\s*版本|MegatronAdaptor)\s*\|")
_MAINTENANCE_ROW = re.compile(r"^\|\s*(\d+\.\d+\.\S+)\s*\|\s*\S+\s*\|\s*(维护|停止维护|无维护|EOL\S*)\s*\|")
_CD_MEGATRON = re.compile(r"^\s*cd\s+Megatron-LM/?\s*$")
_VERSION = re.compile(r"""^__version__\s*=\s*['"][^'"]+['"]""", re.M)
FSDP_FILE = "fsdp"
STATUS = {"维护": "maintained", "停止维护": "unmaintained", "无维护": "unmaintained"}


def _git(mirror: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={mirror}", *args], capture_output=True, text=True, check=True).stdout


def readme_excerpt(readme: str) -> list[str]:
    """The lines that name the Megatron release (and, on master, the maintenance table), verbatim."""
    lines = readme.splitlines()
    keep: list[str] = []
    for i, line in enumerate(lines):
        if _WANTED_ROW.match(line) or _MAINTENANCE_ROW.match(line):
            keep.append(line)
        elif _CD_MEGATRON.match(line):
            keep += lines[i:i + 3]
    return keep


def extract(mirror: Path, data: Path) -> list[str]:
    branches = sorted(b for b in _git(mirror, "for-each-ref", "--format=%(refname:short)", "refs/heads").split()
                      if BRANCH.match(b))
    for branch in branches:
        commit = _git(mirror, "rev-parse", branch).strip()
        where = data / branch
        where.mkdir(parents=True, exist_ok=True)
        note = (f"<!-- Excerpt of Ascend/MindSpeed README.md, branch {branch} at {commit}: the lines that name its "
                "Megatron-LM release (version table, install steps) and the maintenance table, verbatim. "
                "tests/emulated_npu/mindspeed_pairings.py extract -->")
        (where / "README.md").write_text("\n".join([note, *readme_excerpt(_git(mirror, "show", f"{branch}:README.md"))])
                                         + "\n")
        version = _VERSION.search(_git(mirror, "show", f"{branch}:setup.py"))
        header = f"# The version line of Ascend/MindSpeed setup.py, branch {branch} at {commit}"
        (where / "setup.py").write_text(f"{header}\n{version.group(0) if version else ''}\n")
        has_fsdp = bool(_git(mirror, "ls-tree", "-d", branch, "mindspeed/fsdp").strip())
        (where / FSDP_FILE).write_text(f"mindspeed/fsdp {'present' if has_fsdp else 'absent'} at {commit}\n")
    return branches


@dataclass(frozen=True)
class Branch:
    name: str
    pairs_with: str
    declared_by: str
    setup_version: str | None
    has_fsdp: bool
    status: str


def maintenance(readme: str) -> dict[str, str]:
    """Branch -> maintained / unmaintained, from master's maintenance table."""
    return {m.group(1): STATUS.get(m.group(2), m.group(2)) for line in readme.splitlines()
            if (m := _MAINTENANCE_ROW.match(line))}


def branches(data: Path = DATA) -> list[Branch]:
    status = maintenance((data / "master" / "README.md").read_text())
    found = []
    for where in sorted(p for p in data.iterdir() if p.is_dir()):
        readme = (where / "README.md").read_text()
        version = re.search(r"""__version__\s*=\s*['"]([^'"]+)""", (where / "setup.py").read_text())
        setup_version = version.group(1) if version else None
        pairing = declared_pairing(readme, setup_version)
        fsdp = (where / FSDP_FILE).read_text().startswith("mindspeed/fsdp present")
        state = status.get(where.name, "not in master's maintenance table")
        found.append(Branch(where.name, pairing.megatron if pairing else "unknown",
                            pairing.declared_by if pairing else "nothing", setup_version, fsdp, state))
    return found


def table(data: Path = DATA) -> str:
    rows = ["| branch | pairs with megatron-core | declared by | setup.py says | `mindspeed/fsdp` | maintenance "
            "(master README) |", "|---|---|---|---|---|---|"]
    for b in branches(data):
        rows.append(f"| `{b.name}` | {b.pairs_with} | {b.declared_by} | {b.setup_version or '—'} | "
                    f"{'yes' if b.has_fsdp else 'no'} | {b.status} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract")
    ex.add_argument("mirror", type=Path)
    ex.add_argument("--data", type=Path, default=DATA)
    tb = sub.add_parser("table")
    tb.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args(argv)
    if args.command == "extract":
        print("\n".join(extract(args.mirror, args.data)))
    else:
        print(table(args.data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
