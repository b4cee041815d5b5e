"""Performance metrics of one run, measured the same way on every device.

Step time is the median over the steps after a warm-up (Megatron-LM compares a median over a steady window;
MindSpeed-LLM skips warm-up steps), with its spread (max - min over the same steps); a perf-gated scenario times
at least 5 extra steps after the judged ones and takes their median. Throughput counts real
tokens (attention mask, no padding) of the global batch. MFU = FLOPs per token x tokens/s / (peak x ranks),
only where the device model's peak is known (harness/config/devices.py).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from parity.harness.config.devices import peak_flops
from parity.harness.run.records import RunRecord

WARMUP_STEPS = 1
"""Steps left out of the median (compilation, allocator growth); none when the run has only one step."""

PERF_KEYS = ("tokens_per_s", "step_time_s", "peak_memory_mb")
"""Metrics compared with a golden reference as a ratio (candidate / reference)."""


def steady_step_times(record: RunRecord) -> list[float]:
    """The timed steps of a perf-gated run (PerfGate.timed_steps, all after warm steps); otherwise the judged
    steps after a warm-up."""
    if record.timed_step_times_s:
        return list(record.timed_step_times_s)
    times = [s.step_time_s for s in record.steps]
    warmup = min(WARMUP_STEPS, len(times) - 1) if times else 0
    return times[warmup:]


def perf_metrics(record: RunRecord, dtype: str, world_size: int) -> dict[str, Any]:
    steady = steady_step_times(record)
    step = statistics.median(steady) if steady else math.nan
    per_rank = [b / 2**20 for b in (record.peak_memory_per_rank or [record.peak_memory_bytes])]
    tokens_per_s = record.tokens_per_step / step if record.tokens_per_step and step > 0 else math.nan
    device_name = record.provenance.get("device_name", "")
    peak = peak_flops(device_name, dtype)
    mfu = None
    if peak and record.flops_per_token and not math.isnan(tokens_per_s):
        mfu = record.flops_per_token * tokens_per_s / (peak * world_size)
    return {"step_time_s": step, "step_time_spread_s": max(steady) - min(steady) if steady else math.nan,
            "steady_steps": len(steady), "tokens_per_s": tokens_per_s, "forward_time_s": record.forward_time_s,
            "peak_memory_mb": max(per_rank), "peak_memory_mb_per_rank": per_rank, "mfu": mfu,
            "device_name": device_name}


def versus_reference(candidate: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Candidate / reference for each perf metric (e.g. NPU tokens/s ÷ GPU tokens/s), with the reference's
    device; NaN where the reference lacks the metric."""
    ratios: dict[str, Any] = {"device_name": reference.get("device_name", "")}
    for key in PERF_KEYS:
        ref = reference.get(key)
        ratios[key] = candidate[key] / ref if ref and not math.isnan(ref) else math.nan
    return ratios


def step_series(candidate: RunRecord, reference: RunRecord) -> dict[str, list[float]]:
    """Per-step values of both runs, for plots and history."""
    return {"loss": [s.loss for s in candidate.steps], "grad_norm": [s.grad_norm for s in candidate.steps],
            "step_time_s": [s.step_time_s for s in candidate.steps],
            "reference_loss": [s.loss for s in reference.steps],
            "reference_grad_norm": [s.grad_norm for s in reference.steps]}


def reference_perf(reference: RunRecord) -> dict[str, Any]:
    """A golden's perf metrics at the dtype and world size its provenance names."""
    provenance = reference.provenance
    return perf_metrics(reference, str(provenance.get("dtype", "")), int(provenance.get("world_size", 1)))
