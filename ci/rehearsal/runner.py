"""Runs a workflow's jobs as GitHub's runner would: in `needs` order, each job's `if:` against its needs' results,
each matrix row a job of its own, each step's `if:` against the steps before it, `run:` scripts through the shell
GitHub uses (`bash -e {0}` when the step names none: no pipefail), the `GITHUB_ENV` / `GITHUB_OUTPUT` /
`GITHUB_PATH` / `GITHUB_STEP_SUMMARY` files between steps, `continue-on-error`, job outputs, and `timeout-minutes`
(a rehearsal scale applies: CPU-sized rows are quicker than the device's)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import actions, machines
from .expressions import condition, substitute, to_string
from .workflow import Workflow, matrix_rows, needs, order

HOSTED = ("ubuntu-latest", "ubuntu-24.04", "ubuntu-22.04")
#: the machine's own network settings every runner keeps (a runner reaches the registries the way this host does)
_TRUST = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO",
          "NODE_EXTRA_CA_CERTS", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
#: what a container job's environment says about the package index: nothing is reachable (ci/nightly.sh installs
#: from the wheelhouse alone); a pip or uv that tried would fail at once instead of hanging
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "UV_OFFLINE": "1",
           "UV_INDEX_URL": "http://127.0.0.1:9/simple", "HF_HUB_OFFLINE": "1"}


@dataclass(slots=True)
class StepResult:
    name: str
    outcome: str
    conclusion: str
    seconds: float
    log: Path | None = None
    note: str = ""


@dataclass(slots=True)
class JobResult:
    job: str
    row: dict[str, Any]
    result: str
    """success, failure or skipped, as `needs.<job>.result` reads."""
    steps: list[StepResult] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    why: str = ""

    @property
    def label(self) -> str:
        values = ", ".join(to_string(v) for v in list(self.row.values())[:2] if not isinstance(v, (dict, list)))
        return f"{self.job} ({values})" if values else self.job


@dataclass(slots=True)
class Stage:
    """Where the rehearsal runs: its folders, the repository variables and event it plays, the local stand-ins."""

    repo: Path
    work: Path
    event: str
    inputs: dict[str, Any]
    variables: dict[str, str]
    images: dict[str, Path]
    """A container image reference -> the bin/ of the rehearsal image standing in for it."""
    sources: dict[str, Path]
    runner_env: dict[str, str]
    """Environment every runner of the rehearsal has (its own platform facts: PARITY_WHEELHOUSE_PLATFORM)."""
    repository: str = "parity/parity-harness"
    run_id: str = "4242"
    time_scale: float = 1.0
    """A job's `timeout-minutes` times this (the rows a rehearsal runs are CPU-sized)."""
    url_map: dict[str, str] = field(default_factory=dict)
    """An address a step reaches -> the local stand-in the rehearsal serves it from (its network is the package
    registries only): applied to environment values and scripts as they are handed to the step."""
    self_hosted: dict[str, Path] = field(default_factory=dict)
    """A self-hosted runner label without a container (verl's GPU runner set) -> the bin/ of its Python."""
    on_step: Callable[[JobResult, StepResult], None] | None = None
    jobs_only: frozenset[str] | None = None

    @property
    def artifacts(self) -> Path:
        return self.work / "artifacts"

    @property
    def pages(self) -> Path:
        return self.work / "pages"

    @property
    def releases(self) -> Path:
        return self.work / "releases"

    def localise(self, text: str) -> str:
        for address, local in self.url_map.items():
            text = text.replace(address, local)
        return text

    def python(self, version: str) -> Path:
        return machines.clean_python(version, self.work / "toolcache" / f"python-{version}")


def _status(failed: Callable[[], bool]) -> dict[str, Callable[[], bool]]:
    return {"success": lambda: not failed(), "failure": failed, "always": lambda: True, "cancelled": lambda: False}


def _read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines and KEY<<DELIMITER blocks (GitHub's GITHUB_ENV / GITHUB_OUTPUT format)."""
    values: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.is_file() else []
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            block = []
            while index < len(lines) and lines[index] != delimiter:
                block.append(lines[index])
                index += 1
            index += 1
            values[key] = "\n".join(block)
        elif "=" in line:
            key, value = line.split("=", 1)
            values[key] = value
    return values


class JobRun:
    def __init__(self, stage: Stage, workflow: Workflow, name: str, job: dict[str, Any], row: dict[str, Any],
                 index: int, needs_ctx: dict[str, Any]):
        self.stage, self.workflow, self.name, self.job, self.row = stage, workflow, name, job, row
        self.needs_ctx = needs_ctx
        self.home = stage.work / "jobs" / f"{name}-{index}"
        self.workspace = self.home / "workspace"
        self.temp = self.home / "temp"
        self.logs = stage.work / "logs" / f"{name}-{index}"
        for folder in (self.workspace, self.temp, self.logs, self.home / "home"):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        self.summary = self.home / "step_summary.md"
        self.summary.touch()
        self.steps_ctx: dict[str, Any] = {}
        self.job_env: dict[str, str] = {}
        self.extra_path: list[str] = []
        self.failed = False

    def context(self, env: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"github": {"event_name": self.stage.event, "repository": self.stage.repository,
                           "repository_owner": self.stage.repository.split("/")[0],
                           "event": {"repository": {"name": self.stage.repository.split("/")[1]}},
                           "ref": "refs/heads/main", "run_id": self.stage.run_id, "workflow": self.workflow.name,
                           "token": "rehearsal-token", "workspace": str(self.workspace)},
                "vars": self.stage.variables, "inputs": self.stage.inputs, "matrix": self.row,
                "needs": self.needs_ctx, "steps": self.steps_ctx, "env": env or {}, "secrets": {},
                "runner": {"temp": str(self.temp), "os": "Linux", "arch": "X64"},
                "job": {"status": "failure" if self.failed else "success"}, "strategy": {}}

    # -- the machine --------------------------------------------------------------------------------------------
    def machine(self) -> tuple[dict[str, str], str]:
        """The base environment of the job's machine and a description. A hosted runner: its own PATH and the
        rehearsal's service stand-ins. A container job on an Ascend runner set: the image's Python first, the
        emulated cards of the set, no package index."""
        labels = substitute(self.job.get("runs-on"), self.context())
        labels = [substitute(label, self.context()) for label in labels] if isinstance(labels, list) else [labels]
        runs_on = to_string(labels[0])
        stubs = machines.service_stubs(self.home / "services", self.stage.releases, self.stage.sources)
        base = {"HOME": str(self.home / "home"), "LANG": "C.UTF-8", "CI": "true", "GITHUB_ACTIONS": "true",
                "GITHUB_WORKSPACE": str(self.workspace), "RUNNER_TEMP": str(self.temp), "RUNNER_OS": "Linux",
                "GITHUB_REPOSITORY": self.stage.repository, "GITHUB_RUN_ID": self.stage.run_id,
                "GITHUB_EVENT_NAME": self.stage.event, "GITHUB_SHA": self._sha(), "GITHUB_REF": "refs/heads/main",
                "GITHUB_API_URL": "http://127.0.0.1:9", "GITHUB_SERVER_URL": "https://github.com",
                **{k: os.environ[k] for k in _TRUST if k in os.environ},
                **self.stage.runner_env}
        container = self.job.get("container")
        if container is None and runs_on in self.stage.self_hosted:
            base["PATH"] = os.pathsep.join([str(stubs), str(self.stage.self_hosted[runs_on]), "/usr/bin", "/bin"])
            return base, f"self-hosted runner {runs_on}"
        if container is None:
            if runs_on not in HOSTED:
                raise RuntimeError(f"runs-on {runs_on!r} without a container: the rehearsal has no such runner")
            base["PATH"] = os.pathsep.join([str(stubs), str(self.stage.python("3.12")), "/usr/local/bin", "/usr/bin",
                                            "/bin"])
            return base, f"hosted runner {runs_on}"
        image = to_string(substitute(container.get("image") if isinstance(container, dict) else container,
                                     self.context()))
        if image not in self.stage.images:
            raise RuntimeError(f"container image {image!r}: the rehearsal has no image standing in for it "
                               f"(it has: {', '.join(self.stage.images) or 'none'})")
        cards = machines.cards_of(runs_on)
        base.update(OFFLINE)
        base["PATH"] = os.pathsep.join([str(stubs), str(self.stage.images[image]), "/usr/bin", "/bin"])
        base["PARITY_EMULATED_NPU_CARDS"] = str(cards)
        return base, f"{runs_on} ({cards} emulated cards) in image {image}"

    def _sha(self) -> str:
        done = subprocess.run(["git", "-C", str(self.stage.repo), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=False)
        return done.stdout.strip() or "0" * 40

    # -- steps --------------------------------------------------------------------------------------------------
    def run(self) -> JobResult:
        result = JobResult(self.name, self.row, "success")
        try:
            base, where = self.machine()
        except RuntimeError as exc:
            result.result, result.why = "failure", str(exc)
            return result
        result.why = where
        deadline = time.monotonic() + 60 * float(self.job.get("timeout-minutes") or 360) * self.stage.time_scale
        localise = self.stage.localise
        workflow_env = {k: localise(to_string(substitute(v, self.context()))) for k, v in self.workflow.env.items()}
        job_env = {k: localise(to_string(substitute(v, self.context(workflow_env))))
                   for k, v in (self.job.get("env") or {}).items()}
        self.job_env = {**workflow_env, **job_env}
        for number, step in enumerate(self.job.get("steps") or [], start=1):
            name = str(step.get("name") or step.get("uses") or f"step {number}")
            env_ctx = dict(self.job_env)
            status = _status(lambda: self.failed)
            name = to_string(substitute(name, self.context(env_ctx)))
            if not condition(step.get("if"), self.context(env_ctx), status):
                record = StepResult(name, "skipped", "skipped", 0.0)
            else:
                record = self.step(number, name, step, base, deadline)
            result.steps.append(record)
            if step.get("id"):
                self.steps_ctx[step["id"]] = {**self.steps_ctx.get(step["id"], {}), "outcome": record.outcome,
                                              "conclusion": record.conclusion}
            if record.conclusion == "failure":
                self.failed = True
            if self.stage.on_step:
                self.stage.on_step(result, record)
        context = self.context(self.job_env)
        result.outputs = {k: to_string(substitute(v, context)) for k, v in (self.job.get("outputs") or {}).items()}
        result.result = "failure" if self.failed else "success"
        return result

    def step(self, number: int, name: str, step: dict[str, Any], base: dict[str, str], deadline: float) -> StepResult:
        started = time.monotonic()
        log = self.logs / f"{number:02d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:60]}.log"
        files = {key: self.home / f"{key.lower()}-{number}" for key in ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_PATH")}
        for path in files.values():
            path.write_text("")
        env_ctx = dict(self.job_env)
        step_env = {k: self.stage.localise(to_string(substitute(v, self.context(env_ctx))))
                    for k, v in (step.get("env") or {}).items()}
        env = {**base, **self.job_env, **step_env, **{k: str(v) for k, v in files.items()},
               "GITHUB_STEP_SUMMARY": str(self.summary)}
        env["PATH"] = os.pathsep.join([*self.extra_path, base["PATH"]])
        outputs: dict[str, str] = {}
        outcome, note = "success", ""
        try:
            if "uses" in step:
                outputs, note = self.action(step, env_ctx, log)
            else:
                outcome, note = self.script(step, env, log, deadline)
        except (actions.ActionFailed, RuntimeError, ValueError) as exc:
            outcome, note = "failure", str(exc)
            log.write_text(f"{exc}\n")
        outputs.update(_read_env_file(files["GITHUB_OUTPUT"]))
        self.job_env.update(_read_env_file(files["GITHUB_ENV"]))
        self.extra_path = [p for p in files["GITHUB_PATH"].read_text().splitlines() if p] + self.extra_path
        if "__path__" in outputs:
            self.extra_path.insert(0, outputs.pop("__path__"))
        if step.get("id"):
            self.steps_ctx[step["id"]] = {"outputs": outputs}
        keep_going = bool(substitute(step.get("continue-on-error", False), self.context(env_ctx)))
        conclusion = "success" if outcome == "failure" and keep_going else outcome
        return StepResult(name, outcome, conclusion, time.monotonic() - started, log, note)

    def action(self, step: dict[str, Any], env_ctx: dict[str, str], log: Path) -> tuple[dict[str, str], str]:
        inputs = {k: substitute(v, self.context(env_ctx)) for k, v in (step.get("with") or {}).items()}
        ctx = actions.ActionContext(self.stage.repo, self.workspace, self.stage.artifacts, self.stage.pages,
                                    self.stage.sources, self.stage.python, self.job.get("container") is not None,
                                    self.stage.repository)
        outputs = actions.run_action(str(step["uses"]), ctx, inputs)
        log.write_text(f"{step['uses']} {inputs}\n")
        return outputs, ""

    def script(self, step: dict[str, Any], env: dict[str, str], log: Path, deadline: float) -> tuple[str, str]:
        text = self.stage.localise(to_string(substitute(step["run"], self.context(self.job_env))))
        script = self.temp / f"step-{log.stem}.sh"
        script.write_text(text)
        shell = str(step.get("shell") or (self.workflow.defaults.get("run") or {}).get("shell") or "")
        command = {"": ["bash", "-e", str(script)],
                   "bash": ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                   "sh": ["sh", "-e", str(script)], "python": ["python", str(script)]}.get(shell)
        if command is None:
            raise RuntimeError(f"shell {shell!r}: not known to the rehearsal")
        where = self.workspace / str(step.get("working-directory") or "")
        limit = max(1.0, deadline - time.monotonic())
        if step.get("timeout-minutes"):
            limit = min(limit, 60 * float(step["timeout-minutes"]) * self.stage.time_scale)
        with log.open("w") as out:
            process = subprocess.Popen(command, cwd=where, env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            try:
                code = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()
                return "failure", f"timed out after {limit:.0f} s (the job's timeout-minutes)"
        return ("success", "") if code == 0 else ("failure", f"exit {code}")


def run_workflow(stage: Stage, workflow: Workflow) -> list[JobResult]:
    """Every job of the workflow, in order; a job whose `if:` is false, or whose needs did not succeed under the
    default condition, is skipped, as GitHub skips it."""
    results: dict[str, list[JobResult]] = {}
    flat: list[JobResult] = []
    for name in order(workflow):
        job = workflow.jobs[name]
        needs_ctx = {need: {"result": _aggregate(results[need]), "outputs": results[need][-1].outputs}
                     for need in needs(job)}
        failed_needs = any(v["result"] != "success" for v in needs_ctx.values())
        context = {"github": {"event_name": stage.event, "repository_owner": stage.repository.split("/")[0]},
                   "vars": stage.variables, "inputs": stage.inputs, "needs": needs_ctx}
        if stage.jobs_only is not None and name not in stage.jobs_only:
            runs, why = False, "not selected (--jobs)"
        else:
            runs = condition(job.get("if"), context, _status(lambda failed=failed_needs: failed))
            results_of_needs = ", ".join(f"{k} {v['result']}" for k, v in needs_ctx.items())
            why = f"if: {job.get('if') or 'success()'} is false" + (
                f" (needs: {results_of_needs})" if needs_ctx else "")
        if not runs:
            results[name] = [JobResult(name, {}, "skipped", why=why)]
        else:
            results[name] = [JobRun(stage, workflow, name, job, row, index, needs_ctx).run()
                             for index, row in enumerate(matrix_rows(job))]
        flat += results[name]
    return flat


def _aggregate(rows: list[JobResult]) -> str:
    """A matrix job's result as `needs` sees it: failure if any row failed, skipped if all were."""
    kinds = {r.result for r in rows}
    if "failure" in kinds:
        return "failure"
    return "skipped" if kinds == {"skipped"} else "success"
