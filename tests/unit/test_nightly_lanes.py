"""Every Ascend lane of the nightly workflow starts no more ranks than its runner set has cards (verl's runner-set
names end with the card count of their one node), and a planted lane that would is caught; tox passes every
model-path variable the scenario files use."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest
import yaml

from parity.harness.config.matrix import load_file
from parity.harness.config.selection import matches
from parity.harness.run.cards import Oversubscribed, host_ranks

ROOT = Path(__file__).resolve().parents[2]
NIGHTLY = ROOT / ".github" / "workflows" / "nightly.yml"
_MATRIX_REF = re.compile(r"\$\{\{\s*matrix\.(\w+)\s*\}\}")


def lanes(workflow: dict) -> list[tuple[str, str, str, str]]:
    """(job, runner set, scenario files, pytest -m markers) of every lane that runs ci/nightly.sh npu."""
    found = []
    for name, job in workflow["jobs"].items():
        steps = [s for s in job.get("steps", []) if "ci/nightly.sh npu" in s.get("run", "")]
        if not steps:
            continue
        env = steps[0]["env"]
        rows = job.get("strategy", {}).get("matrix", {}).get("include") or [{}]
        for row in rows:
            def value(text: str, row: dict = row) -> str:
                return _MATRIX_REF.sub(lambda m: str(row[m.group(1)]), text)
            files = re.sub(r"\$\{\{\s*inputs\.scenarios \|\| (matrix\.\w+)\s*\}\}", r"${{ \1 }}", env["PARITY_FILES"])
            found.append((name, value(job["runs-on"]), value(files), value(env["PARITY_MARKERS"])))
    return found


def overfull(workflow: dict) -> list[str]:
    """'job/scenario: N ranks > C cards' for every scenario a lane would start on too few cards."""
    problems = []
    for job, runner, files, markers in lanes(workflow):
        cards = int(runner.rsplit("-", 1)[-1])
        for path in files.split():
            for scenario in load_file(ROOT / path):
                if not matches(markers, " ".join(scenario.marks)):
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
    assert {job for job, *_ in lanes(workflow)} == {"smoke", "strict", "ascend"}
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
