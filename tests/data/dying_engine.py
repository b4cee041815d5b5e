"""fsdp2 engines whose rank 1 dies at step 1 without raising: by SIGSEGV, by SIGKILL, or by exiting with status 0
(os._exit, as a library calling exit() in a worker would). Rank 0 is then inside the step's collective and dies of
the broken connection ("Connection reset by peer") a moment later: the launcher must name rank 1, not rank 0."""

from __future__ import annotations

import os
import signal

import torch

from parity.engines.fsdp2.engine import FSDP2Engine
from parity.harness.contract.engine import StepOutput
from parity.harness.contract.workload import Batch


class _DiesOnRank1(FSDP2Engine):
    def die(self) -> None:
        raise NotImplementedError

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput | None:
        if self.ctx.rank == 1 and step == 1:
            self.die()
        return super().train_step(batch, old_logprobs, step)


class SegfaultEngine(_DiesOnRank1):
    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGSEGV)


class KilledEngine(_DiesOnRank1):
    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class ExitZeroEngine(_DiesOnRank1):
    def die(self) -> None:
        os._exit(0)
