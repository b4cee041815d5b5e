"""The megatron engine's pure pieces, in-process: kwargs routing, layout rules, masks, CP chunk order, the CPU
shim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from parity.harness.config.validate import layout_errors
from parity.harness.contract.schema import Scenario

pytest.importorskip("megatron.core")


def _scenario(model: str = "tiny-qwen3", **fields: Any) -> Scenario:
    return Scenario(model=model, strategy="megatron", **fields)


def test_mcore_kwargs_go_to_every_dataclass_that_declares_them() -> None:
    from parity.engines.megatron.config import route_mcore_kwargs

    routed = route_mcore_kwargs({"use_distributed_optimizer": True, "moe_token_dispatcher_type": "alltoall",
                                 "adam_eps": 1e-6, "micro_batch_size": 2, "params_dtype": "bfloat16",
                                 "no_such_field": 1, "tensor_model_parallel_size": 2})
    assert routed.ddp == {"use_distributed_optimizer": True}
    assert routed.optimizer == {"use_distributed_optimizer": True, "adam_eps": 1e-6, "params_dtype": torch.bfloat16}
    assert routed.transformer == {"moe_token_dispatcher_type": "alltoall", "params_dtype": torch.bfloat16}
    assert routed.schedule == {"micro_batch_size": 2}
    assert set(routed.rejected) == {"no_such_field", "tensor_model_parallel_size"}


def test_attention_backend_is_megatrons_enum_as_verl_converts_it() -> None:
    """A string left as is never equals AttnBackend.flash (Megatron's _set_attention_backend compares the enum),
    so 'flash' selected nothing and was still read back as applied."""
    from megatron.core.transformer.enums import AttnBackend

    from parity.engines.megatron.config import readable, route_mcore_kwargs

    routed = route_mcore_kwargs({"attention_backend": "flash"})
    assert routed.transformer == {"attention_backend": AttnBackend.flash}
    assert readable(routed.transformer["attention_backend"]) == "flash"
    with pytest.raises(ValueError, match="'flsh' is not an AttnBackend name"):
        route_mcore_kwargs({"attention_backend": "flsh"})


@pytest.mark.parametrize(("layout", "key"), [
    ({"tp": 2}, "layout.sequence_parallel"),  # MoE with TP needs SP
    ({"pp": 2, "vpp": 4}, "layout.vpp"),  # 4 layers over 8 chunks
    ({"tp": 4, "sequence_parallel": True}, "layout.tp"),  # 2 KV heads
    ({"tp": 2, "sequence_parallel": True, "etp": 4, "dp": 2}, "layout.etp"),  # ep=1: experts follow tp
])
def test_layout_rules(layout: dict[str, Any], key: str) -> None:
    scenario = _scenario("tiny-qwen3-moe", layout=layout)
    assert key in [k for k, _ in layout_errors(scenario)]


@pytest.mark.parametrize(("layout", "size", "wanted"), [
    ({"tp": 2}, 3, "micro_batch_size(3) must divide the 4 rows per data-parallel rank"),
    ({"dp": 2}, 4, "micro_batch_size(4) must divide the 2 rows"),
    ({"tp": 2}, [1, 2], "must be a positive integer (rows per micro-batch), got [1, 2]"),
    ({"tp": 2}, 0, "must be a positive integer"),
    ({"tp": 2}, True, "must be a positive integer"),
    # 4 rows in micro-batches of 4: one micro-batch, not a multiple of pp
    ({"pp": 2, "vpp": 2}, 4, "the interleaved schedule needs the 1 micro-batches per data-parallel rank"),
])
def test_micro_batches_must_split_the_rows_of_a_rank(layout: dict[str, Any], size: Any, wanted: str) -> None:
    """Found when the matrix is validated, not as a TypeError or ValueError in every rank."""
    errors = layout_errors(_scenario(layout=layout, mcore_kwargs={"micro_batch_size": size}))
    assert any(wanted in message for _, message in errors), errors


@pytest.mark.parametrize(("layout", "size"), [({"tp": 2}, 2), ({"tp": 2}, 4), ({"dp": 2}, 2), ({"pp": 2, "vpp": 2}, 2)])
def test_micro_batches_that_split_the_rows_pass(layout: dict[str, Any], size: int) -> None:
    assert layout_errors(_scenario(layout=layout, mcore_kwargs={"micro_batch_size": size})) == []


def test_layout_rules_accept_the_matrix() -> None:
    from parity.harness.config.matrix import load_file

    scenarios = load_file(Path(__file__).parents[2] / "scenarios" / "cpu.yaml")
    megatron = [s for s in scenarios if s.strategy == "megatron"]
    assert megatron
    assert {s.id: layout_errors(s) for s in megatron if layout_errors(s)} == {}


def test_cp_needs_two_chunks_per_rank() -> None:
    scenario = _scenario(layout={"cp": 2}, workload={"prompt_len": 15, "response_len": 16})
    assert [k for k, _ in layout_errors(scenario)] == ["layout.cp"]


def test_attention_mask_is_hf_causal_and_padding() -> None:
    """HF's causal + padding mask, except that a query with no key it may attend (a left pad) attends to itself,
    as transformers' SDPA path does: no row is fully masked (its fused-attention output is undocumented)."""
    from parity.engines.megatron.batching import attention_mask

    real = torch.tensor([[0, 1, 1, 0]])
    allowed = ~attention_mask(real)[0, 0]
    assert allowed.tolist() == [[True, False, False, False], [False, True, False, False], [False, True, True, False],
                                [False, True, True, False]]
    assert not attention_mask(torch.tensor([[0, 0, 0, 1], [1, 1, 1, 1]])).all(dim=-1).any()


def test_cp_chunk_order_matches_megatron_batch_split(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    from parity.engines.megatron.cp_attention import sequence_order
    from parity.engines.megatron.cpu_compat import cpu_compat

    monkeypatch.setattr(parallel_state, "get_context_parallel_world_size", lambda: 2)
    pieces = []
    for rank in range(2):
        monkeypatch.setattr(parallel_state, "get_context_parallel_rank", lambda rank=rank: rank)
        with cpu_compat():  # as the engine runs it on CPU (up to 0.12 the chunk index is pinned and moved to cuda)
            pieces.append(get_batch_on_this_cp_rank({"t": torch.arange(8)[None]})["t"][0])
    gathered = torch.cat(pieces)
    chunks = dict(zip(sequence_order(2), gathered.chunk(4), strict=True))
    assert torch.cat([chunks[c] for c in range(4)]).tolist() == list(range(8))


def test_cpu_shim_restores_everything() -> None:
    from megatron.core.tensor_parallel import mappings, random
    from megatron.core.transformer.moe import moe_utils

    from parity.engines.megatron.cpu_compat import CpuCompat

    def patched_things() -> tuple[Any, ...]:
        return (torch.cuda.current_device, torch.cuda.Stream, random._get_cuda_rng_state,
                mappings._gather_along_first_dim, hasattr(moe_utils, "te_general_gemm"))

    before = patched_things()
    shim = CpuCompat()
    shim.apply()
    try:
        assert torch.cuda.current_device() == torch.device("cpu")
        assert torch.zeros(1, device="cuda").device.type == "cpu"
        assert torch.zeros(1).type() == "torch.cuda.FloatTensor"
    finally:
        shim.restore()
    assert patched_things() == before
    assert torch.zeros(1).type() == "torch.FloatTensor"


def test_cpu_shim_runs_compiled_functions_eagerly_and_restores_dynamo() -> None:
    """Megatron's jit_fuser is torch.compile: under the shim a compiled function runs eagerly (dynamo compiles
    no frame: a cold compile per forked rank cost more than the function), with the same result; afterwards
    dynamo compiles again."""
    from torch._dynamo.utils import counters

    from parity.engines.megatron.cpu_compat import CpuCompat

    def frames_compiled(fn: Any, x: torch.Tensor) -> tuple[int, torch.Tensor]:
        before = counters["frames"]["ok"]
        out = fn(x)
        return counters["frames"]["ok"] - before, out

    x = torch.arange(6.0)
    shim = CpuCompat()
    shim.apply()
    try:
        compiled, out = frames_compiled(torch.compile(lambda t: t * 2 + 1, backend="eager"), x)
    finally:
        shim.restore()
    assert compiled == 0 and torch.equal(out, x * 2 + 1)
    compiled, out = frames_compiled(torch.compile(lambda t: t * 3 - 1, backend="eager"), x)
    assert compiled == 1 and torch.equal(out, x * 3 - 1)

