"""The engine-spec registry and the EngineSpec contract: names, aliases, retired names, requirements with
version ranges, preload exclusions, third-party specs."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from parity.engines.megatron.spec import MEGATRON_LAYOUT_KEYS
from parity.engines.specs import BUILTIN
from parity.engines.verl.blocks import MEGATRON as VERL_MEGATRON_BLOCK
from parity.harness.config import registry, validate
from parity.harness.config.matrix import parse_scenario
from parity.harness.contract.schema import Scenario
from parity.harness.contract.spec import EngineSpec, Requirement, module_present


def test_every_builtin_engine_is_registered_once_and_importable_by_path():
    assert list(registry.SPECS) == [spec.name for spec in BUILTIN]
    for spec in BUILTIN:
        module = spec.engine.partition(":")[0]
        assert module_present(module), spec.engine


def test_alias_and_retired_names_resolve_to_the_spec():
    assert parse_scenario({"model": "tiny-qwen3", "strategy": "fsdp"}, file="f", label="m").strategy == "fsdp2"
    assert registry.RETIRED["mindspeed_llm"][0] == "mindspeed_megatron"
    assert registry.RETIRED["mindspeed_mm"][0] == "mindspeed_fsdp"


def test_layout_owned_megatron_keys_are_stated_once():
    """verl's McoreEngineConfig names translate through the megatron spec's table, not a copy of it."""
    for name, where in MEGATRON_LAYOUT_KEYS.items():
        assert VERL_MEGATRON_BLOCK[name].field == where
    from parity.engines.megatron.config import RESERVED  # the engine refuses the same keys

    assert set(MEGATRON_LAYOUT_KEYS) <= set(RESERVED)


def test_requirement_checks_module_and_version_range(monkeypatch):
    assert Requirement(module="no_such_module_xyz", why="get it").problem() == "get it"
    ok = Requirement(module="torch", why="-", distribution="torch", versions=">=2.0")
    assert ok.problem() is None
    monkeypatch.setattr(md, "version", lambda name: "1.9.0")
    problem = ok.problem()
    assert "torch 1.9.0 is installed" in problem and ">=2.0" in problem
    with pytest.raises(ValueError, match="bad version range"):
        Requirement(module="torch", why="-", versions="~~2")


def test_spec_rejects_unknown_dims_and_kwargs_blocks():
    with pytest.raises(ValueError, match="unknown dims"):
        EngineSpec(name="x", engine="a.b:C", dims=frozenset({"zp"}))
    with pytest.raises(ValueError, match="unknown kwargs_blocks"):
        EngineSpec(name="x", engine="a.b:C", kwargs_blocks=("llm_kwargs",))
    with pytest.raises(ValueError, match=r"package\.module:Class"):
        EngineSpec(name="x", engine="a.b.C")


def test_preload_leaves_out_what_a_planned_engine_must_import_first():
    spec = {s.name: s for s in BUILTIN}
    alone = registry.preload_modules([spec["megatron"], spec["fsdp2"]])
    assert "megatron.core" in alone and "parity.engines.fsdp2.engine" in alone
    with_mindspeed = registry.preload_modules([spec["megatron"], spec["fsdp2"], spec["mindspeed_megatron"]])
    assert not [m for m in with_mindspeed if "megatron" in m]  # MindSpeed patches megatron before its import
    assert "parity.engines.fsdp2.engine" in with_mindspeed


def test_preload_brings_the_planned_models_modeling_modules_unless_an_engine_patches_while_loading():
    spec = {s.name: s for s in BUILTIN}
    models = ["tiny-qwen3-moe", "tiny-llama", "tiny-qwen3-moe"]
    modules = registry.preload_modules([spec["fsdp2"]], models)
    modeling = [m for m in modules if ".modeling_" in m]
    assert modeling == ["transformers.modeling_utils", "transformers.models.qwen3_moe.modeling_qwen3_moe",
                        "transformers.models.llama.modeling_llama"]
    assert not [m for m in registry.preload_modules([spec["fsdp2"], spec["mindspeed_fsdp"]], models)
                if ".modeling_" in m]


def test_the_forkserver_builds_transformers_conversion_table_once(monkeypatch):
    """Forked ranks inherit the table the forkserver built (engines/transformers_warm.py) instead of each
    compiling its ~950 rules on its first from_pretrained."""
    import importlib

    from transformers import conversion_mapping

    spec = {s.name: s for s in BUILTIN}
    assert "parity.engines.transformers_warm" in registry.preload_modules([spec["fsdp2"]], ["tiny-qwen3"])
    monkeypatch.setattr(conversion_mapping, "_checkpoint_conversion_mapping_cache", None)
    importlib.reload(importlib.import_module("parity.engines.transformers_warm"))
    assert conversion_mapping._checkpoint_conversion_mapping_cache  # what get_checkpoint_conversion_mapping reads


def test_runner_preload_ignores_planned_scenarios_that_cannot_run_here(tmp_path):
    """A collected Ascend MindSpeed row (SKIPped on CPU) must not take megatron out of the forkserver: the
    Megatron rows that do run would each import it."""
    from parity.harness.runner import Runner, RunOptions

    megatron = Scenario(model="tiny-qwen3", strategy="megatron", layout={"tp": 2})
    ascend = Scenario(model="tiny-qwen3", strategy="mindspeed_megatron", layout={"tp": 2}, device="npu")
    assert validate.skip_reason(ascend) is not None
    runner = Runner(RunOptions(out_dir=tmp_path), [ascend, megatron])
    preload, excluded = runner.forkserver_preload(megatron)
    assert "megatron.core" in preload and "transformers.models.qwen3.modeling_qwen3" in preload and not excluded


def test_third_party_spec_is_the_class_attribute_renamed_to_its_path():
    scenario = Scenario(model="tiny-qwen3", engine="parity.examples.plain_engine:PlainHFEngine")
    spec = registry.spec_for(scenario)
    assert spec.engine == scenario.engine and spec.name == "PlainHFEngine"
    assert spec.dims == frozenset() and spec.kwargs_blocks == ("engine_kwargs",)


SPECLESS = """
from parity.harness.contract.engine import Engine


class SpeclessEngine(Engine):
    def setup(self):
        raise NotImplementedError

    def forward(self, batch):
        raise NotImplementedError

    def train_step(self, batch, old_logprobs, step):
        raise NotImplementedError
"""


def test_third_party_without_spec_gets_an_open_one(tmp_path, monkeypatch):
    (tmp_path / "specless_engine_mod.py").write_text(SPECLESS)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = registry.third_party_spec("specless_engine_mod:SpeclessEngine")
    assert spec.engine == "specless_engine_mod:SpeclessEngine" and spec.name == "SpeclessEngine"
    assert "tp" in spec.dims and "fsdp_kwargs" in spec.kwargs_blocks and spec.requires == ()


def test_a_subclass_of_a_builtin_engine_inherits_its_spec():
    """A third-party engine that extends a built-in one needs what it needs (requirements, preload, devices)."""
    spec = {s.name: s for s in BUILTIN}
    leaky = registry.third_party_spec("tests.data.leaky_engine:LeakyFSDP2Engine")
    assert leaky.name == "LeakyFSDP2Engine" and leaky.engine == "tests.data.leaky_engine:LeakyFSDP2Engine"
    assert (leaky.dims, leaky.kwargs_blocks, leaky.preload) == (spec["fsdp2"].dims, spec["fsdp2"].kwargs_blocks,
                                                                spec["fsdp2"].preload)
    planted = registry.third_party_spec("tests.emulated_npu.planted:IgnoresOneKwargEngine")
    ms = spec["mindspeed_megatron"]
    assert (planted.requires, planted.devices, planted.preload_excludes) == (ms.requires, ms.devices,
                                                                             ms.preload_excludes)


def test_a_mindspeed_subclass_keeps_megatron_out_of_the_forkserver():
    """Planned next to a Megatron row, a third-party engine extending the MindSpeed one must keep megatron out of
    the forkserver's preload, as the built-in does: MindSpeed patches Megatron before Megatron is imported. With an
    open spec for it (no class spec to inherit), megatron.core was preloaded."""
    from parity.harness.run.preload import forkserver_preload

    rows = [Scenario(model="tiny-qwen3", strategy="megatron", layout={"tp": 2}),
            Scenario(model="tiny-qwen3", engine="tests.emulated_npu.planted:IgnoresOneKwargEngine", layout={"tp": 2})]
    assert "megatron.core" in forkserver_preload(rows[:1])[0]  # the clean twin: megatron alone preloads it
    planned = [registry.spec_for(row) for row in rows]  # as the forkserver plans them where both run
    assert not [m for m in registry.preload_modules(planned) if m.split(".")[0] == "megatron"]
    assert "megatron" in registry.preload_excludes(planned)
    if validate.skip_reason(rows[1]) is None:  # and the whole path, where the planted row runs (the emulated lane)
        preload, excluded = forkserver_preload(rows)
        assert not [m for m in preload if m.split(".")[0] == "megatron"] and "megatron" in excluded


def test_parity_engines_lists_every_spec(capsys):
    from parity.harness.cli import main

    assert main(["engines"]) == 0
    out = capsys.readouterr().out
    for spec in BUILTIN:
        assert spec.name in out
    assert "megatron.core >=" in out


def test_a_plain_megatron_row_on_npu_keeps_megatron_out_of_the_forkserver(monkeypatch):
    """Its ranks import torch_npu's transfer_to_npu before Megatron-Core (EngineSpec.cuda_apis): a forkserver
    holding megatron would hand them torch.cuda's own RNG functions. The same row on CPU preloads it."""
    from parity.harness.run import preload

    monkeypatch.setattr(preload, "skip_reason", lambda scenario, **_: None)  # as on an Ascend runner
    on_cpu = Scenario(model="tiny-qwen3", strategy="megatron", layout={"tp": 2})
    assert "megatron.core" in preload.forkserver_preload([on_cpu])[0]
    on_npu = on_cpu.model_copy(update={"device": "npu"})
    modules, excluded = preload.forkserver_preload([on_npu])
    assert not [m for m in modules if m.split(".")[0] == "megatron"] and "megatron" in excluded
