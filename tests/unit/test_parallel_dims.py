"""ParallelDims (harness/contract/parallel_dims.py): each rule relating the degrees to the batch, the sequence and
the model refuses its planted bad layout naming every factor, and passes its clean twin."""

from __future__ import annotations

import pytest

from parity.harness.config.models import model_shape
from parity.harness.contract.parallel_dims import ParallelDims

pytestmark = pytest.mark.torch_free

QWEN3 = model_shape("tiny-qwen3")
MOE = model_shape("tiny-qwen3-moe")


@pytest.mark.parametrize(("dims", "clean", "batch", "message"), [
    (ParallelDims(dp=3), ParallelDims(dp=2), 4, "batch_size(4) is not divisible by dp(3)"),
])
def test_the_batch_splits_over_dp(dims, clean, batch, message):
    assert dims.batch_problems(batch) == [("workload.batch_size", message)]
    assert clean.batch_problems(batch) == []


@pytest.mark.parametrize(("dims", "clean", "key", "message"), [
    (ParallelDims(ulysses=3), ParallelDims(ulysses=2), "workload",
     "sequence length 32 (prompt_len + response_len) is not divisible by ulysses(3)"),
    (ParallelDims(cp=3), ParallelDims(cp=2), "layout.cp", "sequence length 32 is not divisible by 2*cp(6)"),
    (ParallelDims(tp=3, sequence_parallel=True), ParallelDims(tp=2, sequence_parallel=True), "workload",
     "sequence parallel splits each rank's 32 tokens over tp(3)"),
])
def test_padded_sequences_split_over_ulysses_cp_and_sp(dims, clean, key, message):
    (problem,) = dims.sequence_problems(32, packed=False)
    assert problem[0] == key and message in problem[1]
    assert clean.sequence_problems(32, packed=False) == []
    assert dims.sequence_problems(32, packed=True) == []  # packed streams are padded by the engine to its split


def test_the_model_splits_over_heads_layers_and_experts():
    heads, layers = QWEN3.num_heads, QWEN3.num_layers
    bad_tp = next(d for d in range(2, heads + 1) if heads % d)
    bad_pp = next(d for d in range(2, layers + 1) if layers % d)
    (tp,) = ParallelDims(tp=bad_tp).model_problems(QWEN3, "tiny-qwen3")
    assert tp[0] == "layout.tp" and f"tp({bad_tp})" in tp[1] and f"({heads})" in tp[1]
    (pp,) = ParallelDims(pp=bad_pp).model_problems(QWEN3, "tiny-qwen3")
    assert pp[0] == "layout.pp" and f"pp({bad_pp}) * vpp(1)" in pp[1] and f"{layers} layers" in pp[1]
    (ep,) = ParallelDims(ep=2).model_problems(QWEN3, "tiny-qwen3")
    assert ep == ("layout.ep", "ep(2) must divide the number of experts (0) of tiny-qwen3")
    assert ParallelDims(tp=2, ep=2, sequence_parallel=True).model_problems(MOE, "tiny-qwen3-moe") == []
