"""Validation reads each engine's spec: layout dims, kwargs blocks, layout-owned keys, dtypes, devices and
requirements; generic layout arithmetic applies to every engine."""

from __future__ import annotations

import dataclasses

import pytest

from parity.harness.config import devices, registry, validate
from parity.harness.contract.schema import Scenario

pytestmark = pytest.mark.torch_free


def keys(scenario: Scenario) -> list[str]:
    return [key for key, _ in validate.layout_errors(scenario)]


def test_dims_come_from_the_spec(monkeypatch):
    scenario = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"tp": 2})
    assert keys(scenario) == []
    narrowed = dataclasses.replace(registry.SPECS["fsdp2"], dims=frozenset({"dp", "ulysses"}))
    monkeypatch.setitem(registry.SPECS, "fsdp2", narrowed)
    assert keys(scenario) == ["layout.tp"]


def test_dtype_and_kwargs_blocks_come_from_the_spec(monkeypatch):
    bf16 = Scenario(model="tiny-qwen3", strategy="hf", dtype="bf16", fsdp_kwargs={"x": 1})
    assert keys(bf16) == ["fsdp_kwargs"]
    monkeypatch.setitem(registry.SPECS, "hf", dataclasses.replace(registry.SPECS["hf"], dtypes=("fp32",)))
    assert "dtype" in keys(bf16)


def test_fsdp2_takes_ulysses_or_tp_not_both():
    both = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"tp": 2, "ulysses": 2},
                    workload={"batch_size": 4})
    assert "layout.tp" in keys(both)


@pytest.mark.parametrize(("layout", "key"), [({"dp": 3}, "workload.batch_size"), ({"cp": 3}, "layout.cp"),
                                             ({"tp": 4}, "layout.tp"), ({"pp": 3}, "layout.pp")])
def test_generic_layout_arithmetic(layout, key):
    assert key in keys(Scenario(model="tiny-qwen3", strategy="megatron", layout=layout))


def test_packing_comes_from_the_spec_and_frees_the_sequence_arithmetic(monkeypatch):
    """A packed row for an engine that cannot pack is bad input (never a padded run under a +packed id); packed rows
    have no fixed length, so cp 3 needs no 2·cp-divisible sequence (each engine pads its sequences)."""
    pytest.importorskip("torch", reason="imports a torch engine class (the Python 3.10 lane has no torch)")
    packed = {"packing": "packed"}
    assert keys(Scenario(model="tiny-qwen3", strategy="megatron", layout={"cp": 3}, workload=packed)) == []
    plain = Scenario(model="tiny-qwen3", engine="parity.examples.plain_engine:PlainHFEngine", workload=packed)
    assert keys(plain) == ["workload.packing"]
    monkeypatch.setitem(registry.SPECS, "fsdp2", dataclasses.replace(registry.SPECS["fsdp2"], packings=("padded",)))
    assert keys(Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2}, workload=packed)) == \
        ["workload.packing"]


def test_skip_reason_names_device_and_requirements(monkeypatch):
    monkeypatch.setattr(devices, "npu_emulated", lambda: False)
    on_cpu = Scenario(model="tiny-qwen3", strategy="mindspeed_megatron", device="cpu")
    reason = validate.skip_reason(on_cpu)
    assert "runs on npu, not cpu" in reason
    monkeypatch.setattr(devices, "npu_emulated", lambda: True)
    assert "runs on npu" not in (validate.skip_reason(on_cpu) or "")


def test_environment_check_of_a_spec_skips_when_its_requirements_are_met(monkeypatch):
    spec = dataclasses.replace(registry.SPECS["hf"], environment_check="tests.unit.test_validate:_bad_pairing")
    monkeypatch.setitem(registry.SPECS, "hf", spec)
    assert validate.skip_reason(Scenario(model="tiny-qwen3", strategy="hf")) == "known-bad pairing: a 1.0 with b 2.0"


def _bad_pairing() -> str:
    return "known-bad pairing: a 1.0 with b 2.0"


def test_resume_and_convert_come_from_the_spec(monkeypatch):
    """An engine whose spec does not say its checkpoint can resume / convert gets such a row as bad input; the layout
    a resume continues on is validated as a layout of its own."""
    resumed = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2}, workload={"steps": 3},
                       resume={"after": 1}, convert=True)
    assert keys(resumed) == []
    monkeypatch.setitem(registry.SPECS, "fsdp2", dataclasses.replace(registry.SPECS["fsdp2"], checkpoints=()))
    assert keys(resumed) == ["resume", "convert"]
    moved = Scenario(model="tiny-qwen3", strategy="megatron", layout={"tp": 2}, workload={"steps": 3},
                     resume={"after": 1, "layout": {"tp": 4}})
    assert keys(moved) == ["resume.layout.tp"]


@pytest.mark.parametrize("resume, message", [({"after": 3}, "must be before the last step"),
                                             ({"after": 1, "layout": {"dp": 2, "nodes": 2}}, "nodes")])
def test_a_resume_the_run_cannot_take_is_refused(resume, message):
    with pytest.raises(ValueError, match=message):
        Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2}, workload={"steps": 3}, resume=resume)


def test_a_checkpoint_the_installed_stack_cannot_write_skips_only_resume_and_convert_rows(monkeypatch):
    resumed = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2}, workload={"steps": 3},
                       resume={"after": 1})
    plain = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2})
    monkeypatch.setattr(validate, "checkpoint_problem", lambda spec: None)
    assert validate.skip_reason(resumed) is None
    monkeypatch.setattr(validate, "checkpoint_problem", lambda spec: "the writer is too old")
    assert validate.skip_reason(resumed) == "the writer is too old"
    assert validate.skip_reason(plain) is None
    assert validate.skip_reason(plain.model_copy(update={"convert": True})) == "the writer is too old"


def test_a_golden_not_recorded_skips_naming_it_and_the_command_that_records_it(tmp_path, monkeypatch):
    golden = tmp_path / "qwen3-8b__fsdp2__dp8__bf16__cuda"
    row = Scenario(model="tiny-qwen3", strategy="hf", reference=f"golden:{golden}")
    reason = validate.skip_reason(row)
    assert reason.startswith(f"no golden: golden reference {golden} is not recorded ({golden} has no record.json)")
    assert "parity golden record scenarios/goldens.yaml -k 'qwen3-8b/fsdp2/dp8/bf16/cuda' --device cuda" in reason
    monkeypatch.delenv("PARITY_GOLDEN_DIR", raising=False)
    unset = row.model_copy(update={"reference": "golden:$PARITY_GOLDEN_DIR/qwen3-8b__fsdp2__dp8__bf16__cuda"})
    assert "its directory variable PARITY_GOLDEN_DIR is not set" in validate.skip_reason(unset)
    golden.mkdir()
    (golden / "record.json").write_text("{}")  # recorded: the row runs (its content is judged when read)
    assert validate.skip_reason(row) is None
    validate.check_environment(row)
