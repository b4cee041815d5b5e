"""Every Ascend lane of the nightly workflow starts no more ranks than its runner set has cards (verl's runner-set
names end with the card count of their one node), and a planted lane that would is caught; a row spanning two nodes
is on no lane of one runner and fits two of verl's 8-card nodes; tox passes every
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
    """'job/scenario: N ranks > C cards' for every scenario a lane would start on too few cards, and 'needs N
    runners' for one spanning nodes: a lane is one runner running `ci/nightly.sh npu` without --node-rank, where the
    runner refuses a multi-node row (harness/run/cards.py host_ranks)."""
    problems = []
    for lane in lint_workflows.lanes(workflow):
        job, runner, cards = lane.job, lane.runner, int(lane.runner.rsplit("-", 1)[-1])
        for path in lane.files:
            for scenario in load_file(ROOT / path):
                if not matches(lane.markers, " ".join(scenario.marks)):
                    continue
                if scenario.layout.nodes > 1:
                    problems.append(f"{job}/{scenario.id}: spans {scenario.layout.nodes} nodes, so it needs "
                                    f"{scenario.layout.nodes} runners (one `parity run --node-rank N` each); the "
                                    f"lane is one {runner}")
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
    assert "ascend/qwen3-30b-a3b/fsdp2/dp16-2nodes/bf16/npu: spans 2 nodes, so it needs 2 runners (one `parity run " \
           "--node-rank N` each); the lane is one linux-aarch64-a3-16" in problems


A2B3_CARDS = 8
"""Cards of one of verl's linux-aarch64-a2b3-8 nodes: what each node of a two-node row may use."""


def two_node_problems(scenarios: list) -> list[str]:
    """A row spanning nodes is a `nodes2` row of two nodes, `-k 2nodes` selects it, each node's ranks fit an a2b3-8
    node, and it is not `nightly` (every one-runner lane selects `nightly and ...`)."""
    problems = []
    for scenario in scenarios:
        lay, marks = scenario.layout, set(scenario.marks)
        if lay.nodes == 1:
            continue
        if lay.nodes != 2 or "nodes2" not in marks or "2nodes" not in scenario.id:
            problems.append(f"{scenario.id}: {lay.nodes} nodes, marks {sorted(marks)}: a two-node row is marked "
                            "nodes2 and selected by -k 2nodes")
        if lay.ranks_per_node > A2B3_CARDS:
            problems.append(f"{scenario.id}: {lay.ranks_per_node} ranks per node > {A2B3_CARDS} cards of an "
                            "a2b3-8 node")
        if "nightly" in marks:
            problems.append(f"{scenario.id}: marked nightly, so a one-runner lane selects it")
    return problems


def _planted(tmp_path, monkeypatch, text: str) -> list:
    (tmp_path / "scenarios").mkdir(exist_ok=True)
    (tmp_path / "scenarios" / "ascend_nightly.yaml").write_text(text)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    return load_file(tmp_path / "scenarios" / "ascend_nightly.yaml")


def test_the_two_node_rows_fit_two_a2b3_8_nodes_and_no_single_runner_lane():
    scenarios = load_file(ROOT / "scenarios" / "ascend_nightly.yaml")
    two = [s for s in scenarios if s.layout.nodes > 1]
    assert len(two) >= 2 and {s.strategy for s in two} >= {"fsdp2", "megatron"}
    assert [s.id for s in scenarios if "2nodes" in s.id] == [s.id for s in two]
    assert two_node_problems(scenarios) == []


def test_a_two_node_row_marked_nightly_or_too_wide_is_caught(tmp_path, monkeypatch):
    text = (ROOT / "scenarios" / "ascend_nightly.yaml").read_text()
    block = text.index("# ---- two nodes")
    # planted: the tiny rows marked nightly: the a2b3-8 lanes (both stacks) would start them on one runner
    nightly = text[:block] + text[block:].replace("marks: [npu, nodes2]", "marks: [nightly, npu, nodes2]", 1)
    scenarios = _planted(tmp_path, monkeypatch, nightly)
    tiny = ["tiny-qwen3/fsdp2/dp4-2nodes/fp32/npu", "tiny-qwen3/megatron/tp2-pp2-2nodes/fp32/npu",
            "tiny-qwen3/mindspeed_megatron/tp2-pp2-2nodes/fp32/npu"]
    assert two_node_problems(scenarios) == [f"{i}: marked nightly, so a one-runner lane selects it" for i in tiny]
    caught = overfull(yaml.safe_load(NIGHTLY.read_text()))
    assert {p.split(": ")[0] for p in caught} == {f"ascend/{i}" for i in tiny}
    assert all("spans 2 nodes, so it needs 2 runners" in p for p in caught)
    # planted: 16 ranks per node, wider than an a2b3-8 node
    wide = text[:block] + text[block:].replace("layout: {dp: 4, nodes: 2}", "layout: {dp: 32, nodes: 2}", 1)
    wide = wide[:block] + wide[block:].replace("workload: *tiny", "workload: {<<: *tiny, batch_size: 32}", 1)
    assert two_node_problems(_planted(tmp_path, monkeypatch, wide)) == [
        "tiny-qwen3/fsdp2/dp32-2nodes/fp32/npu: 16 ranks per node > 8 cards of an a2b3-8 node"]


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
