"""Scenario files: expansion, ids, merging of defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import load_file, load_files

pytestmark = pytest.mark.torch_free

REPO = Path(__file__).resolve().parents[2]


def test_lists_on_axes_expand_as_a_cross_product(write_yaml):
    path = write_yaml("""
        defaults: {device: cpu, marks: [nightly, pr], workload: {steps: 3}}
        matrix:
          - model: [tiny-llama, tiny-qwen3]
            strategy: fsdp2
            layout: [{dp: 2}, {ulysses: 2}]
            dtype: [fp32, bf16]
            workload: {batch_size: 8}
    """)
    scenarios = load_file(path)
    assert len(scenarios) == 8
    assert scenarios[0].id == "tiny-llama/fsdp2/dp2/fp32/cpu"
    assert {s.id for s in scenarios} >= {"tiny-qwen3/fsdp2/ulysses2/bf16/cpu"}
    # defaults merge under entries (deep for mappings), lists that are not axes stay values
    assert all(s.workload.steps == 3 and s.workload.batch_size == 8 for s in scenarios)
    assert all(s.marks == ("nightly", "pr") for s in scenarios)


def test_ids_name_layout_faults_and_name(write_yaml):
    path = write_yaml("""
        matrix:
          - {model: tiny-qwen3-moe, strategy: megatron, layout: {tp: 2, ep: 2, dp: 2, sequence_parallel: true},
             faults: [{kind: grad_scale}], name: alltoall}
          - {model: $SOME_MODEL_PATH, strategy: hf}
    """)
    first, second = load_file(path)
    assert first.id == "tiny-qwen3-moe/megatron/dp2-tp2-ep2-sp/fp32/cpu+grad_scale+alltoall"
    assert second.id == "some-model/hf/single/fp32/cpu"


def test_shipped_scenario_files_load_with_unique_ids():
    scenarios = load_files(sorted((REPO / "scenarios").glob("*.yaml")))
    ids = [s.id for s in scenarios]
    assert len(ids) == len(set(ids)) and len(ids) >= 20
    # every shipped scenario belongs to a lane: the nightly, the emulated-NPU lane (which needs a MindSpeed tree),
    # the GPU goldens the nightly is judged against, or two nodes (`nodes2`: scenarios/ascend_nightly.yaml's last
    # block, never on a one-runner lane; tests/multiproc/test_launch.py rehearses it on one host)
    assert all({"nightly", "emulated_npu", "golden", "nodes2"} & set(s.marks) for s in scenarios)


def test_every_golden_the_nightly_names_is_one_goldens_yaml_records():
    """goldens.yml records scenarios/goldens.yaml into directories named by scenario id; a reference that names
    anything else would be a golden nobody makes."""
    from parity.harness.config.paths import slug

    recorded = {slug(s.id) for s in load_files([REPO / "scenarios" / "goldens.yaml"])}
    # a reference names the golden set's device (${PARITY_GOLDEN_DEVICE:-cuda}): goldens.yaml's rows are cuda's
    named = {s.reference.removeprefix("golden:$PARITY_GOLDEN_DIR/").replace("${PARITY_GOLDEN_DEVICE:-cuda}", "cuda")
             for s in load_files([REPO / "scenarios" / "ascend_nightly.yaml"]) if s.reference.startswith("golden:")}
    assert named and named <= recorded, named - recorded


def test_duplicate_ids_are_rejected(write_yaml):
    path = write_yaml("""
        matrix:
          - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}}
          - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}, workload: {steps: 3}}
    """)
    with pytest.raises(ScenarioError, match=r"duplicate scenario id.*give one a 'name'"):
        load_files([path])


def test_content_hash_ignores_marks_but_not_workload(write_yaml):
    path = write_yaml("""
        matrix:
          - {model: tiny-qwen3, strategy: fsdp2, marks: [nightly], name: a}
          - {model: tiny-qwen3, strategy: fsdp2, marks: [pr], name: a2}
          - {model: tiny-qwen3, strategy: fsdp2, workload: {seed: 7}, name: b}
    """)
    a, a2, b = load_file(path)
    assert a.model_copy(update={"name": None}).content_hash() == a2.model_copy(update={"name": None}).content_hash()
    assert a.content_hash() != b.content_hash()


def test_the_schema_carries_its_field_docstrings():
    """The schema's fields are documented by the docstring under each (pydantic's use_attribute_docstrings, 2.7+:
    under an older pydantic the descriptions are silently empty; the Python 3.10 lane runs at that floor)."""
    from parity.harness.contract.schema import Scenario, Workload

    assert Scenario.model_fields["model"].description.startswith("Built-in tiny architecture")
    assert Workload.model_fields["packing"].description
