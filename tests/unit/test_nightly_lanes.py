"""Every Ascend lane of the nightly workflow starts no more ranks than its runner set has cards (verl's runner-set
names end with the card count of their one node), and a planted lane that would is caught; tox passes every
model-path variable the scenario files use; a device lane installs the harness without a package index and checks
what it installed. The lanes are read by the workflow linter's own parser (ci/lint_workflows.py lanes)."""

from __future__ import annotations

import configparser
import importlib.metadata as md
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

from parity.harness.config.matrix import load_file
from parity.harness.config.selection import matches
from parity.harness.run.cards import Oversubscribed, host_ranks

ROOT = Path(__file__).resolve().parents[2]
NIGHTLY = ROOT / ".github" / "workflows" / "nightly.yml"


def _ci_module(name: str):
    spec = importlib.util.spec_from_file_location(f"ci_{name}", ROOT / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


lint_workflows = _ci_module("lint_workflows")
check_install = _ci_module("check_install")


def overfull(workflow: dict) -> list[str]:
    """'job/scenario: N ranks > C cards' for every scenario a lane would start on too few cards."""
    problems = []
    for lane in lint_workflows.lanes(workflow):
        job, runner, cards = lane.job, lane.runner, int(lane.runner.rsplit("-", 1)[-1])
        for path in lane.files:
            for scenario in load_file(ROOT / path):
                if not matches(lane.markers, " ".join(scenario.marks)):
                    continue
                try:
                    ranks = host_ranks(scenario.layout, None, "npu")
                except Oversubscribed as exc:
                    problems.append(f"{job}/{scenario.id}: {exc}")
                    continue
                if ranks > cards:
                    problems.append(f"{job}/{scenario.id}: {ranks} ranks > {cards} cards of {runner}")
    return problems


def test_every_lane_fits_its_runner_set():
    workflow = yaml.safe_load(NIGHTLY.read_text())
    assert {lane.job for lane in lint_workflows.lanes(workflow)} == {"smoke", "strict", "ascend"}
    assert overfull(workflow) == []


def test_a_lane_with_16_card_scenarios_on_an_8_card_runner_is_caught():
    workflow = yaml.safe_load(NIGHTLY.read_text().replace("runner: linux-aarch64-a3-16", "runner: linux-aarch64-a3-8"))
    problems = overfull(workflow)
    assert problems and all("16 ranks > 8 cards of linux-aarch64-a3-8" in p for p in problems)


def test_a_two_node_row_on_one_runner_is_caught(tmp_path, monkeypatch):
    text = (ROOT / "scenarios" / "ascend_nightly.yaml").read_text()
    planted = text.replace("layout: {dp: 16}\n", "layout: {dp: 16, nodes: 2}\n", 1)
    assert planted != text
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "ascend_nightly.yaml").write_text(planted)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    problems = overfull(yaml.safe_load(NIGHTLY.read_text()))
    assert any("no --node-rank was given" in p for p in problems)


def _strings(node: object) -> list[str]:
    """Every string value in a YAML tree (comments are not scenario input)."""
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return [node] if isinstance(node, str) else []


def _tox_pass_env(section: str) -> set[str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return {line.strip() for line in parser[section]["pass_env"].splitlines() if line.strip()}


@pytest.mark.parametrize("scenario_file", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_tox_passes_every_model_path_variable(scenario_file):
    used = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", " ".join(_strings(yaml.safe_load(scenario_file.read_text())))))
    passed = _tox_pass_env("testenv:ascend-nightly")
    wildcards = [p.removesuffix("*") for p in passed if p.endswith("*")]
    missing = {v for v in used if v not in passed and not any(v.startswith(w) for w in wildcards)}
    assert not missing, f"tox.ini [testenv:ascend-nightly] pass_env lacks {sorted(missing)} ({scenario_file.name})"


def test_a_device_lane_installs_from_the_wheelhouse_without_a_package_index():
    """ci/nightly.sh npu: the one pip install it runs names --no-index and the wheelhouse, and then the check."""
    script = (ROOT / "ci" / "nightly.sh").read_text()
    npu = script[script.index("  npu)"):script.index("  cpu)")]
    installs = [line for line in npu.splitlines() if re.search(r"\bpip\s+install\b", line)]
    assert len(installs) == 1 and "--no-index --find-links" in installs[0], installs
    assert "python ci/check_install.py" in npu


def test_the_install_check_names_what_is_missing_or_too_old(monkeypatch):
    requires = ["pyyaml>=6", "no-such-distribution>=1", "tabulate>=999", "megatron-core==0.16.1; extra == 'megatron'"]
    monkeypatch.setattr(check_install.md, "requires", lambda dist: requires)
    problems = check_install.problems()
    assert problems == ["no-such-distribution: not installed (no-such-distribution>=1)",
                        f"tabulate: {md.version('tabulate')} is installed, the harness needs tabulate>=999"]
    monkeypatch.setattr(check_install.md, "requires", lambda dist: ["pyyaml>=6"])
    assert check_install.problems() == []


def _previous_nights(workflow: dict) -> dict[str, tuple[str | None, str | None, str | None, str | None]]:
    """job -> (the artifact its previous-night step fetches, the lane folder it points PARITY_PREVIOUS_OUT at, the
    artifact it uploads, the lane ci/nightly.sh runs), as written in the workflow (expressions unexpanded)."""
    found = {}
    for name, job in workflow["jobs"].items():
        runs = [step.get("run", "") for step in job.get("steps", [])]
        lane = next((m.group(1) for r in runs for m in [re.search(r'ci/nightly\.sh \w+ "?([^"\n]+?)"?$', r, re.M)]
                     if m), None)
        if lane is None:
            continue
        fetched = next((m.groups() for r in runs for m in [re.search(
            r'fetch_artifact\.py --previous "([^"]+)".*?previous-night/(.+?)"\s*>>', r, re.S)] if m), (None, None))
        uploaded = next((step["with"]["name"] for step in job["steps"]
                         if str(step.get("uses", "")).startswith("actions/upload-artifact")
                         and "parity-out" in str(step["with"].get("path", ""))), None)
        found[name] = (*fetched, uploaded, lane)
    return found


def previous_night_problems(workflow: dict) -> list[str]:
    problems = []
    for job, (fetched, folder, uploaded, lane) in _previous_nights(workflow).items():
        if fetched is None:
            problems.append(f"{job}: no previous-night step (ci/fetch_artifact.py --previous)")
        elif fetched != uploaded:
            problems.append(f"{job}: fetches {fetched}, uploads {uploaded}")
        elif folder != lane:
            problems.append(f"{job}: PARITY_PREVIOUS_OUT at {folder}, the lane writes parity-out/{lane}")
    return problems


def test_every_nightly_lane_compares_with_its_own_previous_night():
    """A lane fetches the artifact it uploads and points PARITY_PREVIOUS_OUT at its own lane folder: one that
    fetched another lane's artifact, or the right one at another folder, would never say what changed (nightly.sh
    finds no results.jsonl there and runs without)."""
    workflow = yaml.safe_load(NIGHTLY.read_text())
    assert {"smoke", "strict", "ascend", "cpu", "verl-cpu"} <= set(_previous_nights(workflow))
    assert previous_night_problems(workflow) == []


def test_a_previous_night_of_another_lane_or_none_is_caught():
    workflow = yaml.safe_load(NIGHTLY.read_text())
    for step in workflow["jobs"]["cpu"]["steps"]:
        step["run"] = step.get("run", "").replace("previous-night/cpu", "previous-night/cpu-two-nodes")
    workflow["jobs"]["verl-cpu"]["steps"] = [s for s in workflow["jobs"]["verl-cpu"]["steps"]
                                             if "--previous" not in s.get("run", "")]
    assert previous_night_problems(workflow) == [
        "cpu: PARITY_PREVIOUS_OUT at cpu-two-nodes, the lane writes parity-out/cpu",
        "verl-cpu: no previous-night step (ci/fetch_artifact.py --previous)"]
