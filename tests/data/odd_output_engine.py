"""Engines with odd outputs: 0-dim tensors in StepOutput (accepted, coerced to floats) and log-probs of the wrong
shape (the run ERRORs naming the method)."""

from __future__ import annotations

import torch

from parity.examples.plain_engine import PlainHFEngine
from parity.harness.contract.engine import StepOutput, TokenOutputs


class TensorStepEngine(PlainHFEngine):
    spec = None

    def train_step(self, batch, old_logprobs, step) -> StepOutput:
        out = super().train_step(batch, old_logprobs, step)
        return StepOutput(loss=torch.tensor(out.loss), grad_norm=torch.tensor(out.grad_norm))


class FlatLogprobEngine(PlainHFEngine):
    spec = None

    def forward(self, batch) -> TokenOutputs:
        out = super().forward(batch)
        return TokenOutputs(logprobs=out.logprobs.flatten(), entropy=out.entropy)
