"""RunRecord: what one engine run produced. Metrics as JSON, tensors as safetensors, plus provenance."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from parity.harness.config.paths import RECORD, TENSORS

RunStatus = Literal["ok", "error", "timeout", "skipped"]


@dataclass(slots=True)
class StepRecord:
    """One optimizer update: a step's only one, or one of its Workload.updates_per_step (mini-batches x epochs),
    in order. Per-step facts (group grad norms, expert load, lr) sit on the step's last update."""

    step: int
    loss: float
    grad_norm: float
    """Before clipping."""
    step_time_s: float
    """The step's time, shared evenly by its updates."""
    group_grad_norms: dict[str, float] | None = None
    """Pre-clip grad norm per HF parameter group (parity.harness.contract.grad_groups); None = not reported."""
    expert_load: dict[str, list[float]] | None = None
    """Tokens per expert per MoE layer in this step's training forward (StepOutput.expert_load); None = not
    reported."""
    lr: list[float] | None = None
    """Every optimizer param group's learning rate at this step's update (StepOutput.lr); None = not reported."""
    update: int = 1
    """Which update of its step (1-based)."""



@dataclass(slots=True)
class RunRecord:
    """One run of one engine on one scenario (or a reference run)."""

    run_id: str
    scenario_hash: str
    status: RunStatus
    steps: list[StepRecord] = field(default_factory=list)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """logprobs_before / entropy_before / logprobs_after / entropy_after: [B, R] fp32; response_mask: [B, R]."""
    forward_time_s: float = 0.0
    peak_memory_bytes: int = 0
    """Rank 0's peak (device allocator; resident set size on CPU)."""
    peak_memory_per_rank: list[int] = field(default_factory=list)
    """Every rank's peak, by rank."""
    tokens_per_step: int = 0
    """Real (unpadded) tokens of the global batch one step trains on."""
    flops_per_token: float = 0.0
    """Training FLOPs per token (harness/config/flops.py); 0 when unknown."""
    applied_kwargs: dict[str, Any] = field(default_factory=dict)
    effective_dtype: str | None = None
    """The dtype the engine reports it computed in (Engine.effective_dtype), None if it cannot tell."""
    optimizer_steps: int | None = None
    """Optimizer steps the engine took, read back from its optimizer (Engine.optimizer_steps); None = unknown."""
    provenance: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    log_tail: str | None = None
    wall_time_s: float = 0.0
    """Launch to collected record, as the parent saw it."""
    compute_time_s: float = 0.0
    """Inside the ranks: setup + forwards + steps."""
    timed_step_times_s: list[float] = field(default_factory=list)
    """A perf-gated scenario's extra steps, timed after the judged ones (PerfGate.timed_steps); empty otherwise."""
    fingerprint: dict[str, Any] | None = None
    """Per-module output statistics of the first forward (parity.harness.contract.fingerprint.merge); None when
    the engine exposes no modules (Engine.fingerprint_points)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def metrics_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("tensors")
        return data

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        if self.tensors:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in self.tensors.items()}, str(directory / TENSORS))
        tmp = directory / f"{RECORD}.tmp"
        tmp.write_text(json.dumps(self.metrics_dict(), indent=1, default=str))
        tmp.replace(directory / RECORD)

    @classmethod
    def load(cls, directory: Path) -> RunRecord:
        data = json.loads((directory / RECORD).read_text())
        data["steps"] = [StepRecord(**s) for s in data.get("steps", [])]
        record = cls(**data)
        tensor_file = directory / TENSORS
        if tensor_file.is_file():
            from safetensors.torch import load_file

            record.tensors = load_file(str(tensor_file))
        return record

    @classmethod
    def failed(cls, run_id: str, scenario_hash: str, status: RunStatus, error: str,
               log_tail: str | None = None) -> RunRecord:
        return cls(run_id=run_id, scenario_hash=scenario_hash, status=status, error=error, log_tail=log_tail)
