"""The megatron-core capability probes (engines/megatron/compat.py) against the INSTALLED release, whichever of the
supported range it is: each probe's answer must agree with what the real Megatron function does when called. CI
runs this file on 0.16.1 (the main venv) and on 0.12.1 (the megatron012 lane), where most probes answer the
other way. The multi-process engine tests are the end-to-end proof (every layout matches HF on both releases)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from parity.engines.megatron import compat


def test_takes_counts_named_parameters_not_a_bare_kwargs() -> None:
    def builder(config: Any, *, vp_stage: int | None = None) -> None: ...

    def old_builder(config: Any, **kwargs: Any) -> None: ...

    assert compat.takes(builder, "vp_stage")
    assert not compat.takes(old_builder, "vp_stage")
    assert compat.vp_stage_kwargs(builder, 1) == {"vp_stage": 1}
    assert compat.vp_stage_kwargs(old_builder, 1) == {}


def test_vp_stage_is_all_or_nothing_in_the_installed_release() -> None:
    """One release takes `vp_stage` in every builder the engine calls, or in none (then building_stage sets the
    global rank): a mix would build chunks with inconsistent stages."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel, gpt_layer_specs

    answers = {compat.takes(f, "vp_stage") for f in (GPTModel.__init__, gpt_layer_specs.get_gpt_decoder_block_spec,
                                                       parallel_state.is_pipeline_first_stage,
                                                       parallel_state.is_pipeline_last_stage)}
    assert len(answers) == 1


@pytest.fixture
def pp2_vpp2(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Megatron's own parallel_state globals for pp=2, vpp=2 (restored afterwards), without process groups."""
    from megatron.core import parallel_state

    monkeypatch.setattr(parallel_state, "_MPU_PIPELINE_MODEL_PARALLEL_WORLD_SIZE", 2)
    monkeypatch.setattr(parallel_state, "_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE", 2)
    monkeypatch.setattr(parallel_state, "_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK", 0)
    return lambda rank: monkeypatch.setattr(parallel_state, "_MPU_PIPELINE_MODEL_PARALLEL_RANK", rank)


@pytest.mark.parametrize("pp_rank", [0, 1])
def test_stage_probes_place_every_virtual_chunk(pp2_vpp2: Any, pp_rank: int) -> None:
    """pp=2 x vpp=2: model chunk v of pipeline rank r is virtual stage v*2 + r; only 0 is first, only 3 last."""
    from megatron.core import parallel_state

    pp2_vpp2(pp_rank)
    for vp_stage in (0, 1):
        with compat.building_stage(vp_stage):
            first, last = compat.is_first_stage(vp_stage), compat.is_last_stage(vp_stage)
        assert (first, last) == (pp_rank == 0 and vp_stage == 0, pp_rank == 1 and vp_stage == 1)
        assert parallel_state.get_virtual_pipeline_model_parallel_rank() == 0  # restored after each chunk


def test_last_physical_stage_ignores_the_current_virtual_rank(pp2_vpp2: Any) -> None:
    """The owner test runs after a schedule left the global virtual rank anywhere (0 here): the last pipeline
    rank is the last physical stage all the same."""
    pp2_vpp2(1)
    assert compat.is_last_physical_stage()
    pp2_vpp2(0)
    assert not compat.is_last_physical_stage()


class _CPGroup:
    """The two methods Megatron's RoPE slicer reads from a CP process group (rank 1 of 2)."""

    def size(self) -> int:
        return 2

    def rank(self) -> int:
        return 1


def test_rope_slice_calls_the_installed_function_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """CP rank 1 of 2 holds chunks 1 and 2 of 4, whether the installed function takes the group (0.13+) or reads
    the global CP state (0.12)."""
    from megatron.core import parallel_state

    from parity.engines.megatron.cpu_compat import cpu_compat

    monkeypatch.setattr(parallel_state, "get_context_parallel_world_size", lambda: 2)
    monkeypatch.setattr(parallel_state, "get_context_parallel_rank", lambda: 1)
    emb = torch.arange(8.0)[:, None, None, None]
    with cpu_compat():  # pins and moves its index to cuda, as the model runs it on CPU
        sliced = compat.pos_emb_on_this_cp_rank(emb, 0, _CPGroup())
    assert sliced.flatten().tolist() == [2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("arity", [2, 3])
def test_rope_slice_takes_a_replacement_at_call_time(monkeypatch: pytest.MonkeyPatch, arity: int) -> None:
    """MindSpeed replaces the slicer after import with a 2-argument version: the one found at call time is called,
    with as many arguments as it takes."""
    from megatron.core.models.common.embeddings import rotary_pos_embedding

    calls: list[tuple[Any, ...]] = []
    two = lambda emb, seq_dim: calls.append((emb, seq_dim)) or emb  # noqa: E731
    three = lambda emb, seq_dim, group: calls.append((emb, seq_dim, group)) or emb  # noqa: E731
    monkeypatch.setattr(rotary_pos_embedding, "get_pos_emb_on_this_cp_rank", two if arity == 2 else three)
    compat.pos_emb_on_this_cp_rank("emb", 0, "group")
    assert calls == [("emb", 0, "group")[:arity]]


def test_process_groups_come_from_whichever_keyword_the_release_passes() -> None:
    cp = object()
    assert compat.cp_group_of(pg_collection=SimpleNamespace(cp=cp)) is cp
    assert compat.cp_group_of(model_comm_pgs=SimpleNamespace(cp=cp)) is cp
    tp = object()
    assert compat.tp_group_of(SimpleNamespace(tp_group=tp)) is tp


def test_adamw_setting_agrees_with_the_optimizer_config() -> None:
    """`decoupled_weight_decay` is passed exactly where OptimizerConfig accepts it."""
    from megatron.core.optimizer import OptimizerConfig

    kwargs = compat.adamw_kwargs()
    config = OptimizerConfig(optimizer="adam", **kwargs)
    assert getattr(config, "decoupled_weight_decay", True) is True
    if not kwargs:
        with pytest.raises(TypeError):
            OptimizerConfig(optimizer="adam", decoupled_weight_decay=True)


def test_decay_on_every_param_binds_to_the_installed_optimizer_factory() -> None:
    import inspect

    from megatron.core import optimizer

    kwargs = compat.decay_every_param_kwargs()
    inspect.signature(optimizer.get_megatron_optimizer).bind(optimizer.OptimizerConfig(), [], **kwargs)
    exempt = kwargs.get("no_weight_decay_cond")
    assert exempt is None or not exempt("decoder.final_layernorm.weight", torch.zeros(4))


def test_installed_release_is_supported_and_others_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core import package_info

    from parity.engines.megatron.spec import MEGATRON_CORE

    assert compat.unsupported_version() is None
    for outside in ("0.11.0", "0.17.0", "not-a-version"):
        monkeypatch.setattr(package_info, "__version__", outside)
        assert compat.unsupported_version() == (f"megatron-core {outside} is installed; this engine supports "
                                                f"{MEGATRON_CORE.versions}")


def test_validation_skips_with_the_same_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Requirement that SKIPs a scenario at validation says what setup would raise."""
    from megatron.core import package_info

    from parity.engines.megatron.spec import MEGATRON_CORE
    from parity.harness.contract import spec

    monkeypatch.setattr(package_info, "__version__", "0.11.0")
    monkeypatch.setattr(spec.md, "version", lambda name: "0.11.0")
    assert MEGATRON_CORE.problem() == compat.unsupported_version()


def test_cpu_shim_refuses_a_release_outside_the_range_before_patching(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core import package_info

    from parity.engines.megatron.cpu_compat import CpuCompat
    from parity.engines.megatron.spec import MEGATRON_CORE

    current_device = torch.cuda.current_device
    monkeypatch.setattr(package_info, "__version__", "0.17.0")
    with pytest.raises(RuntimeError) as refused:
        CpuCompat().apply()
    assert "megatron-core 0.17.0 is installed" in str(refused.value)
    assert MEGATRON_CORE.versions in str(refused.value)
    assert torch.cuda.current_device is current_device


def test_cpu_shim_lets_the_distributed_optimizer_quantize_nothing() -> None:
    """Without Transformer Engine the distributed optimizer calls the fp8 quantizer with no params on every step
    (up to 0.12 it raises even then); anything to quantize still raises."""
    from megatron.core import fp8_utils

    from parity.engines.megatron.cpu_compat import cpu_compat

    with cpu_compat():
        fp8_utils.quantize_param_shard([], [], [], None)
        with pytest.raises(RuntimeError):
            fp8_utils.quantize_param_shard([torch.zeros(1)], [torch.zeros(1)], [0], None)
