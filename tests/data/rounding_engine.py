"""fsdp2 engines that compute in fp32 whatever the scenario's dtype, then round what they report to that dtype
(log-probs, entropy, loss and pre-clip grad norm; or the log-probs only), and report the scenario's dtype as the
one they computed in. A bf16 scenario's log-probs then sit a bf16 rounding away from fp32 (past the old lower
bound, 1e-3) while no bf16 arithmetic ran: the precision checks must FAIL both."""

from __future__ import annotations

from typing import Any

import torch

from parity.engines.fsdp2.engine import FSDP2Engine
from parity.harness.contract.engine import StepOutput, TokenOutputs
from parity.harness.contract.workload import Batch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _rounded(value: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(value, dtype=torch.float64).to(dtype).double())


class RoundingFSDP2Engine(FSDP2Engine):
    def fully_shard_settings(self, given: dict[str, Any]) -> dict[str, Any]:
        return super().fully_shard_settings({**given, "param_dtype": "fp32"})

    def effective_dtype(self) -> str | None:
        return self.ctx.scenario.dtype

    @property
    def _dtype(self) -> torch.dtype:
        return DTYPES[self.ctx.scenario.dtype]

    def forward(self, batch: Batch) -> TokenOutputs | None:
        out = super().forward(batch)
        if out is None:
            return None
        return TokenOutputs(logprobs=out.logprobs.to(self._dtype).float(), entropy=out.entropy.to(self._dtype).float())

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput | None:
        out = super().train_step(batch, old_logprobs, step)
        if out is None:
            return None
        return StepOutput(loss=_rounded(out.loss, self._dtype), grad_norm=_rounded(out.grad_norm, self._dtype),
                          group_grad_norms=out.group_grad_norms)


class RoundedLogprobsFSDP2Engine(RoundingFSDP2Engine):
    """Rounds the log-probs only: its entropy stays fp32-exact (the twin above rounds it too)."""

    def forward(self, batch: Batch) -> TokenOutputs | None:
        out = FSDP2Engine.forward(self, batch)
        if out is None:
            return None
        return TokenOutputs(logprobs=out.logprobs.to(self._dtype).float(), entropy=out.entropy)
