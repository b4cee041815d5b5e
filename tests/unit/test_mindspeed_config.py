"""CPU tests of the MindSpeed engines' config translation: scenario -> MindSpeed args / ParallelEngineConfig.

The engines themselves need an Ascend NPU; what they hand to MindSpeed is pure data and is checked here,
including the bug classes verl hit: CP that never reached MindSpeed's args, fsdp_kwargs that never reached
the engine.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from parity.engines.mindspeed import fsdp as msf
from parity.engines.mindspeed import megatron as msm
from parity.engines.specs import MINDSPEED_FSDP, MINDSPEED_MEGATRON
from parity.harness.contract.engine import Engine, EngineContext
from parity.harness.contract.schema import Scenario

ROOT = Path(__file__).resolve().parents[2]

#: a few names MindSpeed's parser registers (mindspeed/features_manager/context_parallel/*.py)
MINDSPEED_KEYS = {"context_parallel_algo", "cp_window_size", "attention_mask_type", "ulysses_degree_in_cp",
                  "use_cp_send_recv_overlap", "optimization_level", "use_fused_rmsnorm"}
#: a few TransformerConfig fields
MEGATRON_KEYS = {"recompute_granularity", "moe_token_dispatcher_type", "attention_dropout", "context_parallel_size"}


def scenario(strategy: str = "mindspeed_megatron", **kw: Any) -> Scenario:
    return Scenario(**{"model": "tiny-qwen3", "strategy": strategy, "dtype": "bf16", "device": "npu", **kw})


# ---- mindspeed_megatron -------------------------------------------------------------------------------------
def test_repatch_gets_what_verl_passes_and_the_padded_rows_mask_type() -> None:
    """verl's _mindspeed_repatch: its override config, use_flash_attn (default True), the CP size when cp > 1 —
    not the layout, which reaches Megatron through the TransformerConfig. Left-padded rows add the 'general' mask
    type (and, under CP, Megatron-LM's reset_attention_mask flag MindSpeed's own split reads); packed rows keep
    MindSpeed's default 'causal'."""
    lay = {"tp": 2, "pp": 2, "vpp": 2, "cp": 2, "ep": 2, "etp": 1, "dp": 1, "sequence_parallel": True}
    assert msm.repatch_args(scenario(layout=lay)) == {"use_flash_attn": True, "context_parallel_size": 2,
                                                      "attention_mask_type": "general", "reset_attention_mask": False}
    packed = scenario(layout=lay, workload={"packing": "packed"})
    assert msm.repatch_args(packed) == {"use_flash_attn": True, "context_parallel_size": 2}
    assert msm.repatch_args(scenario(layout={"tp": 2, "dp": 1})) == {"use_flash_attn": True,
                                                                     "attention_mask_type": "general"}


def test_mcore_kwargs_routed_by_reader() -> None:
    s = scenario(layout={"cp": 2, "dp": 1}, mcore_kwargs={
        "context_parallel_algo": "kvallgather_cp_algo", "use_flash_attn": False, "recompute_granularity": "full",
        "context_parallel_size_typo": 2})
    plan = msm.plan_mindspeed_args(s, MINDSPEED_KEYS, MEGATRON_KEYS)
    assert plan.mindspeed_args["context_parallel_size"] == 2
    assert plan.mindspeed_args["context_parallel_algo"] == "kvallgather_cp_algo"
    assert plan.mindspeed_args["use_flash_attn"] is False
    # the Megatron engine routes (or rejects) the rest; a typo never reaches MindSpeed's args
    assert plan.routed == {"context_parallel_algo": "mindspeed", "use_flash_attn": "mindspeed",
                           "recompute_granularity": "megatron", "context_parallel_size_typo": "megatron"}
    assert "recompute_granularity" not in plan.mindspeed_args
    assert "context_parallel_size_typo" not in plan.mindspeed_args and plan.rejected == {}


def test_defaults_turn_flash_attention_on() -> None:
    plan = msm.plan_mindspeed_args(scenario(), MINDSPEED_KEYS, MEGATRON_KEYS)
    assert plan.mindspeed_args == {"use_flash_attn": True, "attention_mask_type": "general"}
    assert plan.routed == {} and plan.rejected == {}


@pytest.mark.parametrize(("key", "where"), [("context_parallel_size", "layout.cp"),
                                            ("sequence_parallel", "layout.sequence_parallel"),
                                            ("tensor_model_parallel_size", "layout.tp")])
def test_layout_owned_kwargs_are_not_applied(key: str, where: str) -> None:
    plan = msm.plan_mindspeed_args(scenario(layout={"tp": 2, "dp": 1}, mcore_kwargs={key: 4}), MINDSPEED_KEYS,
                                   MEGATRON_KEYS)
    assert where in plan.rejected[key] and key not in plan.routed
    assert plan.mindspeed_args.get(key) != 4  # the layout's value stands


def test_cp_algorithm_must_match_the_megatron_split() -> None:
    s = scenario(layout={"cp": 2, "dp": 1}, mcore_kwargs={"context_parallel_algo": "ulysses_cp_algo"})
    with pytest.raises(ValueError, match="megatron_cp_algo"):
        msm.plan_mindspeed_args(s, MINDSPEED_KEYS, MEGATRON_KEYS)
    # packed rows: the ring-causal TND path over MindSpeed's per-sequence split only
    packed = scenario(layout={"cp": 2, "dp": 1}, mcore_kwargs={"context_parallel_algo": "kvallgather_cp_algo"},
                      workload={"packing": "packed"})
    with pytest.raises(ValueError, match="per-sequence THD split, which only megatron_cp_algo expects"):
        msm.plan_mindspeed_args(packed, MINDSPEED_KEYS, MEGATRON_KEYS)


def test_real_transformer_config_fields_route_to_megatron() -> None:
    pytest.importorskip("megatron.core")
    import dataclasses

    from megatron.core.transformer import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    plan = msm.plan_mindspeed_args(scenario(mcore_kwargs={"recompute_granularity": "full", "cp_window_size": 1,
                                                          "optimization_level": 0}), MINDSPEED_KEYS, fields)
    assert plan.routed == {"recompute_granularity": "megatron", "cp_window_size": "mindspeed",
                           "optimization_level": "mindspeed"}


class _FakeMegatronBase(Engine):
    """The hooks of parity.engines.megatron.MegatronEngine, recording what the subclass hands over."""

    def setup(self) -> None: ...
    def forward(self, batch: Any) -> None: ...
    def train_step(self, batch: Any, old_logprobs: Any, step: int) -> None: ...
    def prepare_megatron(self) -> None: ...
    def use_transformer_engine(self) -> bool:
        return False

    def transformer_config_kwargs(self) -> dict[str, Any]:
        return {"num_layers": 4, "use_flash_attn": True, "sequence_parallel": True, "recompute_granularity": "full"}

    def applied_kwargs(self) -> dict[str, Any]:
        return {"mcore_kwargs": {"recompute_granularity": "full"}}

    def _warn_rejected(self) -> None:
        self.warned = dict(self.routed.rejected)


def _fake_mindspeed(monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """mindspeed.args_utils / megatron_adaptor stand-ins with the real semantics: repatch() sets attributes on
    the one namespace get_full_args() returns (mindspeed/megatron_adaptor.py, mindspeed/args_utils.py)."""
    defaults = {"context_parallel_algo": "megatron_cp_algo", "cp_window_size": 1, "optimization_level": 2}
    live = argparse.Namespace(**defaults, context_parallel_algo_stale="from an earlier run")
    args_utils = types.ModuleType("mindspeed.args_utils")
    args_utils.get_mindspeed_args = lambda get_defaults=False: argparse.Namespace(**defaults) if get_defaults else live
    args_utils.get_full_args = lambda: live
    adaptor = types.ModuleType("mindspeed.megatron_adaptor")
    adaptor.repatch = lambda values: [setattr(live, k, v) for k, v in values.items()]
    for name, module in {"mindspeed": types.ModuleType("mindspeed"), "mindspeed.args_utils": args_utils,
                         "mindspeed.megatron_adaptor": adaptor}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return live


def test_prepare_megatron_repatches_before_model_parallel_init(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("megatron.core")
    live = _fake_mindspeed(monkeypatch)
    cls = type("Engine", (msm._MindSpeedMegatronMixin, _FakeMegatronBase), {})
    s = scenario(layout={"cp": 2, "tp": 2, "dp": 1}, mcore_kwargs={"cp_window_size": 1, "use_flash_attn": False,
                                                                    "recompute_granularity": "full",
                                                                    "context_parallel_size": 1})
    engine = cls(EngineContext(scenario=s, checkpoint=Path("."), rank=0, world_size=4, local_rank=0,
                               device=__import__("torch").device("cpu")))
    engine.prepare_megatron()
    assert live.context_parallel_size == 2 and not hasattr(live, "tensor_model_parallel_size")  # as verl passes
    assert live.use_flash_attn is False and live.optimization_level == 2
    engine.arch = types.SimpleNamespace(num_experts=0)
    config = engine.transformer_config_kwargs()
    assert "use_flash_attn" not in config  # reaches TransformerConfig through MindSpeed's patched __init__
    assert config["context_parallel_size"] == 2 and config["sequence_parallel"] is False
    assert config["recompute_granularity"] == "full" and config["num_layers"] == 4
    assert "moe_grouped_gemm" not in config
    engine.arch = types.SimpleNamespace(num_experts=4)  # verl's MoE default, in the TransformerConfig
    assert engine.transformer_config_kwargs()["moe_grouped_gemm"] is True
    # the Megatron engine's "no such field" warning is not shown for keys MindSpeed applied
    engine.routed = types.SimpleNamespace(rejected={"use_flash_attn": "no field", "typo": "no field"})
    engine._warn_rejected()
    assert engine.warned == {"typo": "no field"} and set(engine.routed.rejected) == {"use_flash_attn", "typo"}
    # read back from the TransformerConfig MindSpeed built (its patched __init__ copies its args onto it); the
    # layout-owned key stays out, so the harness fails the scenario as "dropped engine kwargs"
    engine.config = types.SimpleNamespace(cp_window_size=1, use_flash_attn=False)
    assert engine.applied_kwargs() == {"mcore_kwargs": {"recompute_granularity": "full", "cp_window_size": 1,
                                                        "use_flash_attn": False}}
    # a key MindSpeed's args took but its config never got is not reported as applied (FAILs as dropped)
    del engine.config.cp_window_size
    assert engine.applied_kwargs() == {"mcore_kwargs": {"recompute_granularity": "full", "use_flash_attn": False}}


# ---- mindspeed_fsdp -----------------------------------------------------------------------------------------
def test_fsdp_layout_sizes() -> None:
    cfg = msf.plan_fsdp(scenario("mindspeed_fsdp", layout={"dp": 2, "tp": 2, "ulysses": 2})).config
    assert (cfg["fully_shard_parallel_size"], cfg["tensor_parallel_size"], cfg["ulysses_parallel_size"]) == (2, 2, 2)
    assert cfg["context_parallel_size"] == 1
    assert cfg["tp_plan"]["colwise_parallel"] == msf.TP_COLWISE and cfg["fsdp_plan"]["param_dtype"] == "bf16"
    assert cfg["fsdp_plan"]["ignored_modules"] == []  # MindSpeed extends it in place: must be a list


def test_fsdp_expert_sizes_give_a_divide_factor_of_dp() -> None:
    cfg = msf.plan_fsdp(scenario("mindspeed_fsdp", model="tiny-qwen3-moe", layout={"dp": 4, "ep": 2})).config
    assert cfg["expert_parallel_size"] * cfg["expert_fully_shard_parallel_size"] * cfg["expert_data_parallel_size"] == 4
    assert cfg["ep_plan"]["apply_modules"] == cfg["ep_plan"]["apply_efsdp_modules"] == [msf.EXPERTS]


@pytest.mark.parametrize("layout", [{"cp": 2, "dp": 1}, {"pp": 2, "dp": 1}, {"dp": 2, "tp": 2, "ep": 2}])
def test_fsdp_layouts_it_cannot_take(layout: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="mindspeed_fsdp"):
        msf.plan_fsdp(scenario("mindspeed_fsdp", layout=layout))


def test_fsdp_kwargs_land_in_the_config_and_an_unknown_key_does_not() -> None:
    kwargs = {"reshard_after_forward": False, "param_dtype": "fp32", "reduce_dtype": "bf16",
              "num_to_forward_prefetch": 1, "recompute": True, "ep_dispatcher": "fused", "reshard_after_fwd": True}
    plan = msf.plan_fsdp(scenario("mindspeed_fsdp", layout={"dp": 2}, fsdp_kwargs=kwargs))
    cfg = plan.config
    assert cfg["fsdp_plan"]["apply_modules"][msf.LAYERS]["reshard_after_forward"] is False
    assert (cfg["fsdp_plan"]["param_dtype"], cfg["fsdp_plan"]["reduce_dtype"]) == ("fp32", "bf16")
    assert cfg["fsdp_plan"]["num_to_forward_prefetch"] == 1 and cfg["ep_plan"]["dispatcher"] == "fused"
    assert cfg["recompute"] is True and cfg["recompute_plan"] == [msf.LAYERS]
    assert plan.dropped == ("reshard_after_fwd",)
    assert set(plan.applied) == set(kwargs) - {"reshard_after_fwd"}
    # applied_kwargs() reads these paths back from the real config: they must point where the value went
    assert {k: msf.lookup(cfg, msf.FSDP_KWARGS[k][0]) for k in plan.applied} == plan.applied


@pytest.mark.parametrize(("key", "value"), [("param_dtype", "bfloat16"), ("reshard_after_forward", "yes"),
                                            ("num_to_backward_prefetch", -1), ("ep_dispatcher", "alltoall")])
def test_fsdp_kwargs_bad_values_name_the_key(key: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"fsdp_kwargs.{key}"):
        msf.plan_fsdp(scenario("mindspeed_fsdp", fsdp_kwargs={key: value}))


def test_fsdp_compute_dtype_names_modules_that_compute_in_another_dtype() -> None:
    """MindSpeed's expert FSDP hard-codes a bf16 policy: one wrapped module off the scenario's dtype must show."""
    same = {"model": "fp32", "model.model.layers.0": "fp32", "model.model.layers.0.mlp.experts": "fp32"}
    assert msf.compute_dtype(same, "bf16") == "fp32" and msf.compute_dtype({}, "fp16") == "fp16"
    mixed = same | {"model.model.layers.0.mlp.experts": "bf16"}
    assert msf.compute_dtype(mixed, "fp32") == ("fp32 in 2 FSDP modules (model, model.model.layers.0); "
                                                "bf16 in 1 FSDP module (model.model.layers.0.mlp.experts)")


# ---- requirements and imports -------------------------------------------------------------------------------
def test_mindspeed_on_cpu_skips_naming_the_device_unless_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    from parity.harness.config import devices, validate

    monkeypatch.setattr(devices, "npu_emulated", lambda: False)
    cpu = Scenario(model="tiny-qwen3", strategy="mindspeed_fsdp", dtype="fp32", device="cpu")
    assert "runs on npu, not cpu" in validate.skip_reason(cpu)
    validate.check_scenario(cpu)  # fp32 is not refused: MindSpeed's patches run in fp32


@pytest.mark.parametrize("spec", [MINDSPEED_MEGATRON, MINDSPEED_FSDP])
def test_missing_requirements_name_mindspeed_and_torch_npu(spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    reason = "; ".join(spec.missing())
    assert "mindspeed" in reason and "torch_npu" in reason


@pytest.mark.skipif(importlib.util.find_spec("mindspeed") is not None, reason="mindspeed is installed here")
@pytest.mark.parametrize("spec", [MINDSPEED_MEGATRON, MINDSPEED_FSDP])
def test_missing_requirements_on_this_box(spec: Any) -> None:
    assert any("needs the mindspeed package" in m for m in spec.missing())


def test_importing_the_engines_imports_neither_torch_npu_nor_mindspeed() -> None:
    code = ("import sys, parity.engines.mindspeed.megatron as m, parity.engines.mindspeed.fsdp\n"
            "heavy = [n for n in sys.modules if n.split('.')[0] in ('torch_npu', 'mindspeed', 'megatron')]\n"
            "assert not heavy, heavy\n"
            "m.MindSpeedMegatronEngine  # building the class must not import them either without an NPU\n"
            "assert not [n for n in sys.modules if n.split('.')[0] in ('torch_npu', 'mindspeed')]\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("mindspeed") is not None, reason="mindspeed is installed here")
def test_megatron_engine_setup_says_what_is_missing() -> None:
    import torch

    cls = msm.MindSpeedMegatronEngine
    assert issubclass(cls, Engine)
    engine = cls(EngineContext(scenario=scenario(), checkpoint=Path("."), rank=0, world_size=1, local_rank=0,
                               device=torch.device("cpu")))
    with pytest.raises(RuntimeError, match="needs the mindspeed package"):
        engine.setup()
