"""How many steps an optimizer took, read back from its own state (not counted by the caller)."""

from __future__ import annotations

from typing import Any


def zero_adam_moments(optimizer: Any) -> None:
    """Fault `resume_adam_moments_zeroed`: a restored optimizer whose moments came back as zeros while its step
    counts did not (a checkpoint that kept the wrong state keys, a resharding that dropped them). A torch optimizer,
    or Megatron's (chained) optimizer, each of which wraps a torch one as `.optimizer`."""
    for inner in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        for state in getattr(inner, "optimizer", inner).state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key].zero_()


def finish_resume(optimizer: Any, optimizer_state: Any | None, scheduler: Any, scheduler_state: Any,
                  faults: Any) -> None:
    """The tail of every engine's load_checkpoint: the optimizer's state (None: loaded with the model already, as
    torch DCP's set_state_dict does) and the LR scheduler's state back, then the planted fault
    `resume_adam_moments_zeroed` where it is active."""
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    if faults.active("resume_adam_moments_zeroed"):
        zero_adam_moments(optimizer)


def torch_optimizer_steps(optimizer: Any) -> int | None:
    """The largest per-parameter `step` in a torch optimizer's state (Adam keeps one per parameter; fused and
    TE optimizers keep it per param group). None when the optimizer keeps no step (plain SGD) or has no state."""
    steps = [state["step"] for state in optimizer.state.values() if "step" in state]
    steps += [group["step"] for group in optimizer.param_groups if "step" in group]
    if not steps:
        return None
    return int(max(float(s) for s in steps))
