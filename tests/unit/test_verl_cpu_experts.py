"""The CPU grouped linear that stands in for Transformer Engine's under verl's Megatron experts
(engines/verl/cpu_experts.py) marks its weights as TE's GroupedLinear.reset_parameters does: every weight a
tensor-parallel shard. Megatron's grad norm keeps an unmarked weight on TP rank 0 only, which under tp > etp drops
TP rank 1's experts from the norm and the clip (verl's tp2-ep2-etp1 rows reported a short pre-clip norm)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")

import torch
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

from parity.engines.verl.cpu_experts import CpuColumnGroupedLinear, CpuRowGroupedLinear


def build(cls, ep: int, etp: int):
    config = SimpleNamespace(expert_model_parallel_size=ep, params_dtype=torch.float32, perform_initialization=False)
    group = SimpleNamespace(size=lambda: etp)
    return cls(3, 8, 12, config=config, init_method=None, bias=False, skip_bias_add=False, is_expert=True,
               pg_collection=SimpleNamespace(expt_tp=group))


@pytest.mark.parametrize(("cls", "dim"), [(CpuColumnGroupedLinear, 0), (CpuRowGroupedLinear, 1)])
@pytest.mark.parametrize(("ep", "etp"), [(2, 1), (1, 2), (2, 2)])
def test_every_expert_weight_is_a_tensor_parallel_shard_as_te_marks_it(cls, dim, ep, etp):
    linear = build(cls, ep, etp)
    tp_rank1 = SimpleNamespace(rank=lambda: 1)
    weights = [getattr(linear, f"weight{j}") for j in range(3)]
    assert [(w.tensor_model_parallel, w.partition_dim, w.partition_stride) for w in weights] == [(True, dim, 1)] * 3
    # TP rank 1's experts count in the norm
    assert [param_is_not_tensor_parallel_duplicate(w, tp_rank1) for w in weights] == [True] * 3


def test_an_unmarked_weight_is_what_megatron_leaves_out_on_tp_rank_1():
    """The twin: the mark is what keeps the weight; without it Megatron's filter drops it on TP rank 1."""
    weight = torch.nn.Parameter(torch.zeros(2, 2))
    assert not param_is_not_tensor_parallel_duplicate(weight, SimpleNamespace(rank=lambda: 1))
