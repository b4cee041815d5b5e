"""Performance metrics: median after warm-up, every rank's memory, tokens/s, MFU from the device table,
FLOPs per token from a checkpoint's headers, and the |Δ log-prob| histogram."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from parity.harness.config.devices import peak_flops
from parity.harness.config.flops import active_params, train_flops_per_token
from parity.harness.judge.distribution import abs_diff_histogram, edges
from parity.harness.judge.perf import perf_metrics, versus_reference
from parity.harness.run.records import RunRecord, StepRecord


def record(times: list[float], peaks: list[int], device: str = "vm", flops: float = 0.0) -> RunRecord:
    steps = [StepRecord(step=i + 1, loss=1.0, grad_norm=1.0, step_time_s=t) for i, t in enumerate(times)]
    return RunRecord(run_id="r", scenario_hash="h", status="ok", steps=steps, peak_memory_bytes=peaks[0],
                     peak_memory_per_rank=peaks, tokens_per_step=1000, flops_per_token=flops,
                     provenance={"device_name": device})


def test_step_time_is_the_median_after_warmup_and_memory_the_worst_rank():
    m = perf_metrics(record([9.0, 1.0, 1.2, 1.1], [2**20, 3 * 2**20]), "fp32", 2)
    assert m["step_time_s"] == pytest.approx(1.1) and m["step_time_spread_s"] == pytest.approx(0.2)
    assert m["steady_steps"] == 3 and m["tokens_per_s"] == pytest.approx(1000 / 1.1)
    # rank 1 is the hungry one: a rank-0-only record would have said 1 MB
    assert m["peak_memory_mb"] == 3.0 and m["peak_memory_mb_per_rank"] == [1.0, 3.0]
    assert m["mfu"] is None  # no peak FLOP/s for a CPU


def test_one_step_run_keeps_its_only_step():
    assert perf_metrics(record([2.0], [1]), "fp32", 1)["step_time_s"] == 2.0


def test_mfu_uses_the_device_table_and_every_rank():
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12 and peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert peak_flops("NVIDIA H200", "int4") is None and peak_flops("cpu", "bf16") is None
    m = perf_metrics(record([1.0, 0.5], [1, 1], "NVIDIA H200", flops=989e12 / 4000), "bf16", 2)
    assert m["mfu"] == pytest.approx(989e12 / 4000 * 2000 / (989e12 * 2))


def test_ratio_to_a_golden_reference():
    npu = perf_metrics(record([1.0, 2.0], [2 * 2**20]), "bf16", 1)
    gpu = perf_metrics(record([1.0, 1.0], [2**20], "NVIDIA H200"), "bf16", 1)
    ratios = versus_reference(npu, gpu)
    assert ratios["tokens_per_s"] == pytest.approx(0.5) and ratios["step_time_s"] == pytest.approx(2.0)
    assert ratios["peak_memory_mb"] == pytest.approx(2.0) and ratios["device_name"] == "NVIDIA H200"
    assert math.isnan(versus_reference(npu, {"device_name": "x"})["tokens_per_s"])


def test_flops_per_token_counts_active_experts_and_attention(tmp_path):
    cfg = {"num_hidden_layers": 2, "hidden_size": 4, "num_experts": 4, "num_experts_per_tok": 1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({"model.embed_tokens.weight": torch.zeros(10, 4), "lm_head.weight": torch.zeros(10, 4),
               "model.layers.0.mlp.experts.0.up.weight": torch.zeros(8, 4),
               "model.layers.0.self_attn.q.weight": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    # untied: the lookup table is not a matmul; one expert of four is active
    assert active_params(tmp_path) == 40 + 32 / 4 + 16
    assert train_flops_per_token(tmp_path, 8) == 6 * 64 + 12 * 2 * 4 * 8
    assert train_flops_per_token(tmp_path / "missing", 8) == 0.0


def test_histogram_puts_each_token_in_its_decade():
    ref = torch.zeros(1, 4)
    cand = torch.tensor([[0.0, 3e-6, 3e-3, float("nan")]])
    hist = abs_diff_histogram(cand, ref, torch.tensor([[1, 1, 1, 0]]))
    bins = edges()
    filled = {round(math.log10(bins[i]), 2) for i, c in enumerate(hist["counts"]) if c}
    assert hist["below"] == 1 and hist["above"] == 0 and sum(hist["counts"]) == 2  # NaN is masked out
    assert filled == {-5.75, -2.75}  # 3e-6 in [10^-5.75, 10^-5.5), 3e-3 in [10^-2.75, 10^-2.5)
    assert abs_diff_histogram(cand, ref, torch.ones(1, 4))["above"] == 1  # a NaN token is counted, not dropped
