"""Optimizer steps read back from a real torch optimizer's state."""

from __future__ import annotations

import torch

from parity.harness.contract.optim_state import torch_optimizer_steps


def _stepped(optimizer_class: type, steps: int, **kwargs: float) -> torch.optim.Optimizer:
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = optimizer_class([param], lr=0.1, **kwargs)
    for _ in range(steps):
        param.grad = torch.ones(3)
        optimizer.step()
    return optimizer


def test_adam_counts_its_steps_and_none_before_the_first():
    assert torch_optimizer_steps(_stepped(torch.optim.AdamW, 2)) == 2
    assert torch_optimizer_steps(_stepped(torch.optim.AdamW, 0)) is None


def test_plain_sgd_keeps_no_step_so_it_cannot_tell():
    assert torch_optimizer_steps(_stepped(torch.optim.SGD, 2)) is None
