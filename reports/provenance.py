"""What ran tonight and what changed since the previous night: the project commit, each engine package's version or
source commit, the device and the image, read from the rows' own provenance (each rank records it:
harness/run/worker.py), and, against the latest earlier run of the history, the versions and verdicts that moved,
naming that night by date and commit. The terminal, summary.md and report.html open on it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

PACKAGES = ("torch", "transformers", "megatron-core", "mindspeed", "verl", "torch_npu", "cann")
"""The engine packages a reviewer asks about, in the order shown; a package no row recorded is shown as '-'."""


SOURCE_TREES = {"verl": "verl", "mindspeed": "mindspeed", "megatron_lm": "megatron-core"}
"""Provenance key of a package's source tree (engines/verl/source.py, engines/mindspeed_env.py, harness/run/
worker.source_checkout) -> the package it is shown as."""


def _short(commit: str | None) -> str:
    return (commit or "")[:10]


def _package_values(provenance: dict[str, Any]) -> dict[str, str]:
    """package -> its version, or version @ commit for a source tree (PARITY_VERL_SRC, a MindSpeed clone)."""
    values = {name: str(v) for name, v in (provenance.get("versions") or {}).items() if v}
    for key, name in SOURCE_TREES.items():  # the account of the tree a package was imported from
        tree = provenance.get(key)
        if isinstance(tree, dict) and (tree.get("version") or tree.get("commit")):
            version = tree.get("version") or values.get(name) or "?"
            values[name] = str(version) + (f" @ {_short(tree['commit'])}" if tree.get("commit") else "")
    if provenance.get("cann"):
        values["cann"] = str(provenance["cann"])
    return values


@dataclass(frozen=True, slots=True)
class Night:
    """One run's provenance over its rows (a value that differs between rows lists each, most common first)."""

    commit: str
    packages: dict[str, str] = field(default_factory=dict)
    devices: str = "-"
    images: str = "-"
    date: str = ""

    def lines(self) -> list[str]:
        versions = ", ".join(f"{name} {self.packages.get(name, '-')}" for name in PACKAGES)
        extra = ", ".join(f"{n} {v}" for n, v in self.packages.items() if n not in PACKAGES)
        return [f"commit {self.commit}  device {self.devices}  image {self.images}",
                f"versions: {versions}" + (f", {extra}" if extra else "")]


def _joined(values: list[str]) -> str:
    return " | ".join(v for v, _ in Counter(values).most_common()) if values else "-"


def night(results: list[dict[str, Any]]) -> Night:
    provenances = [r.get("provenance") or {} for r in results if r.get("verdict") != "SKIP"] or \
        [r.get("provenance") or {} for r in results]
    per_package: dict[str, list[str]] = {}
    for provenance in provenances:
        for name, value in _package_values(provenance).items():
            per_package.setdefault(name, []).append(value)
    started = [str(p["started"]) for p in provenances if p.get("started")]
    return Night(commit=_joined([str(p["harness_commit"]) for p in provenances if p.get("harness_commit")]),
                 packages={name: _joined(values) for name, values in per_package.items()},
                 devices=_joined([str(p["device_name"]) for p in provenances if p.get("device_name")]),
                 images=_joined([str(p["image"]) for p in provenances if p.get("image")]),
                 date=min(started)[:10] if started else "")


def changed(before: Night, after: Night) -> list[str]:
    """What differs between two nights' provenance: commit, device, image, each package."""
    lines = []
    for label, old, new in (("commit", before.commit, after.commit), ("device", before.devices, after.devices),
                            ("image", before.images, after.images)):
        if old != new:
            lines.append(f"{label} {old} -> {new}")
    for name in dict.fromkeys([*PACKAGES, *before.packages, *after.packages]):
        old, new = before.packages.get(name, "-"), after.packages.get(name, "-")
        if old != new:
            lines.append(f"{name} {old} -> {new}")
    return lines


@dataclass(frozen=True, slots=True)
class Provenance:
    """The block every output opens on."""

    tonight: Night
    previous: Night | None = None
    previous_label: str = ""
    versions_changed: list[str] = field(default_factory=list)
    verdicts_changed: list[str] = field(default_factory=list)

    def heading(self) -> str | None:
        if self.previous is None:
            return None
        return f"since the previous night, {self.previous.date or 'undated'} at commit {self.previous.commit} " \
               f"({self.previous_label})"

    def lines(self) -> list[str]:
        """Plain lines (terminal, markdown): tonight, then what changed since the previous night."""
        lines = self.tonight.lines()
        if (heading := self.heading()) is not None:
            lines.append(heading + ":")
            lines += [f"  changed: {line}" for line in self.versions_changed] or ["  versions: none changed"]
            lines += [f"  {line}" for line in self.verdicts_changed] or ["  verdicts: none changed"]
        return lines


def provenance(results: list[dict[str, Any]], history: list[Any] | None = None) -> Provenance:
    """`history`: earlier runs (reports/history.Run, oldest first); the latest of them is the previous night."""
    tonight = night(results)
    if not history:
        return Provenance(tonight)
    from parity.reports.history import changes_since

    previous_run = history[-1]
    previous = night(list(previous_run.results.values()))
    verdicts = [line.split(": ", 1)[1] for line in changes_since(history, results)]
    verdicts = [line for line in verdicts if line != "none"]
    return Provenance(tonight, previous, previous_run.label, changed(previous, tonight), verdicts)
