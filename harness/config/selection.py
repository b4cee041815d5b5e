"""Scenario selection shared by the CLI and the pytest plugin: device override, -k expressions, validation."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_files
from parity.harness.config.validate import check_environment, check_scenario, skip_reason
from parity.harness.contract.schema import Scenario

DEFAULT_FILES = (Path("scenarios/cpu.yaml"),)
_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def scenario_files(names: list[str]) -> list[Path]:
    """The files named on the command line, or the default matrix."""
    return [Path(name) for name in names] or list(DEFAULT_FILES)


def matches(expression: str, text: str) -> bool:
    """pytest-style -k: words match as case-insensitive substrings, combined with and / or / not / ()."""
    parts = []
    for token in _TOKEN.findall(expression):
        if token in ("and", "or", "not", "(", ")"):
            parts.append(token)
        else:
            parts.append(str(token.lower() in text.lower()))
    try:
        return bool(eval(" ".join(parts) or "True", {"__builtins__": {}}, {}))  # only True/False/and/or/not
    except SyntaxError:
        raise ScenarioError(f"cannot parse -k expression {expression!r}") from None


def with_device(scenarios: Iterable[Scenario], device: str | None) -> list[Scenario]:
    if device is None:
        return list(scenarios)
    return [s.model_copy(update={"device": device}) for s in scenarios]


def over_nodes(scenarios: Iterable[Scenario], nodes: int | None) -> list[Scenario]:
    """The same rows with their ranks split over `nodes` node agents (the multi-node rehearsal on one host); a row
    whose world size does not split evenly is bad input naming it."""
    if nodes is None:
        return list(scenarios)
    moved = []
    for scenario in scenarios:
        layout = scenario.layout
        if nodes < 1 or layout.world_size % nodes or (layout.nproc_per_node and layout.nproc_per_node * nodes !=
                                                      layout.world_size):
            raise ScenarioError(f"--nodes {nodes}: world size {layout.world_size} does not split over {nodes} nodes",
                                file=scenario.source, scenario=scenario.id, key="layout")
        moved.append(scenario.model_copy(update={"layout": layout.model_copy(update={"nodes": nodes})}))
    return moved


def select(paths: list[Path], keyword: str | None = None, device: str | None = None) -> list[Scenario]:
    """Load, override the device, filter by -k, and run the static checks (errors raise ScenarioError)."""
    scenarios = with_device(load_files(paths), device)
    if keyword:
        scenarios = [s for s in scenarios if matches(keyword, s.id)]
    for scenario in scenarios:
        check_scenario(scenario)
    return scenarios


def check_runnable(scenarios: Iterable[Scenario]) -> None:
    """Environment checks for every scenario that will actually run here."""
    for scenario in scenarios:
        if skip_reason(scenario) is None:
            check_environment(scenario)
