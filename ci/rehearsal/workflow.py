"""A workflow file as the runner reads it: its jobs in `needs` order, each job's matrix rows, and the contexts its
expressions see. Pure: nothing here runs a step."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True, slots=True)
class Workflow:
    path: Path
    name: str
    env: dict[str, Any]
    jobs: dict[str, dict[str, Any]]
    dispatch_inputs: dict[str, dict[str, Any]]
    """`on.workflow_dispatch.inputs` (name -> its declaration: default, type, options)."""
    defaults: dict[str, Any] = field(default_factory=dict)


def load(path: Path) -> Workflow:
    data = yaml.safe_load(path.read_text()) or {}
    triggers = data.get("on", data.get(True)) or {}  # YAML 1.1 reads a bare `on` as True
    dispatch = triggers.get("workflow_dispatch") if isinstance(triggers, dict) else None
    return Workflow(path, str(data.get("name", path.stem)), dict(data.get("env") or {}), dict(data.get("jobs") or {}),
                    dict((dispatch or {}).get("inputs") or {}), dict(data.get("defaults") or {}))


def needs(job: dict[str, Any]) -> list[str]:
    value = job.get("needs") or []
    return [value] if isinstance(value, str) else list(value)


def order(workflow: Workflow) -> list[str]:
    """Jobs so that each comes after every job it needs (file order otherwise); a cycle or an unknown need is an
    error, as GitHub refuses such a workflow before it starts."""
    done: list[str] = []
    pending = list(workflow.jobs)
    while pending:
        ready = [name for name in pending if all(need in done for need in needs(workflow.jobs[name]))]
        if not ready:
            unknown = {n: [x for x in needs(workflow.jobs[n]) if x not in workflow.jobs] for n in pending}
            raise ValueError(f"{workflow.path}: jobs {pending} wait on each other or on unknown jobs {unknown}")
        done.append(ready[0])
        pending.remove(ready[0])
    return done


def matrix_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The matrix's combinations, as GitHub builds them: the product of the axes, less `exclude`, then each
    `include` entry extends every combination whose original values it does not contradict, or is added alone."""
    matrix = (job.get("strategy") or {}).get("matrix")
    if not isinstance(matrix, dict):
        return [{}]
    axes = {k: v for k, v in matrix.items() if k not in ("include", "exclude")}
    rows = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())] if axes else []
    for excluded in matrix.get("exclude") or []:
        rows = [row for row in rows if any(row.get(k) != v for k, v in excluded.items())]
    # include entries extend the axes' combinations only (never one another's): GitHub's "Expanding or adding
    # matrix configurations" example adds {fruit: banana} and {fruit: banana, animal: cat} as two rows
    product = rows
    originals = [dict(row) for row in product]
    added: list[dict[str, Any]] = []
    for entry in matrix.get("include") or []:
        matched = False
        for row, original in zip(product, originals, strict=True):
            if all(original.get(k, v) == v for k, v in entry.items() if k in axes):
                row.update(entry)
                matched = True
        if not matched:
            added.append(dict(entry))
    rows = product + added
    return rows or [{}]


def dispatch_defaults(workflow: Workflow, given: dict[str, str]) -> dict[str, Any]:
    """The `inputs` context of a manual run: each declared input's default, overridden by what was given; a name the
    workflow does not declare is refused, as GitHub refuses it."""
    unknown = sorted(set(given) - set(workflow.dispatch_inputs))
    if unknown:
        raise ValueError(f"{workflow.path}: workflow_dispatch declares no input {', '.join(unknown)} "
                         f"(it declares: {', '.join(workflow.dispatch_inputs) or 'none'})")
    values: dict[str, Any] = {}
    for name, spec in workflow.dispatch_inputs.items():
        value = given.get(name, (spec or {}).get("default", ""))
        if (spec or {}).get("type") == "boolean" and isinstance(value, str):
            value = value.lower() == "true"
        values[name] = value
    return values
