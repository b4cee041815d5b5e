"""MoE load statistics: the reference counts real tokens at its routers, the judge compares per layer and step."""

from __future__ import annotations

import torch
import transformers

from parity.engines.hf.common import RouterLoads
from parity.harness.judge.loads import expert_load_checks
from parity.harness.judge.tolerances import FP32
from parity.harness.run.records import RunRecord, StepRecord


def _record(loads):
    return RunRecord(run_id="r", scenario_hash="h", status="ok",
                     steps=[StepRecord(step=1, loss=1.0, grad_norm=1.0, step_time_s=0.0, expert_load=loads)])


def test_load_checks_are_opt_in_and_name_layer_expert_and_totals():
    ref = _record({"layers.0.mlp": [3.0, 5.0], "layers.1.mlp": [4.0, 4.0]})
    cand = _record({"layers.0.mlp": [3.0, 5.0], "layers.1.mlp": [6.0, 4.0]})  # two padding tokens counted
    assert expert_load_checks(cand, ref, FP32) == []  # not asked for
    checks = expert_load_checks(cand, ref, FP32.model_copy(update={"expert_load_abs": 0.0}))
    failing = [c.reason() for c in checks if not c.passed]
    assert failing == ["layer 1 mlp expert load max |Δ| (tokens) at step 1 = 2 > limit 0 "
                       "(abs; expert 0: 6 vs 4; totals 10 vs 8)"]
    silent = expert_load_checks(_record(None), ref, FP32.model_copy(update={"expert_load_abs": 0.0}))
    assert [c.passed for c in silent] == [False] and "candidate reports none" in silent[0].note


def test_hf_router_loads_count_real_tokens_only():
    config = transformers.Qwen3MoeConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4,
                                         num_experts_per_tok=2, moe_intermediate_size=8, decoder_sparse_step=1,
                                         mlp_only_layers=[])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    loads = RouterLoads(model)
    ids = torch.randint(1, 50, (2, 6))
    real = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    with torch.no_grad():
        model(input_ids=ids)  # outside counting(): not counted
        with loads.counting(real):
            model(input_ids=ids, attention_mask=real)
    counted = loads.take()
    assert sorted(counted) == ["layers.0.mlp", "layers.1.mlp"]
    assert all(sum(c) == 2 * 9 for c in counted.values())  # top-2 of the 9 real tokens, each layer
    assert loads.take() == {}  # taken: reset
