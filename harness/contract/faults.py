"""Fault injection: deliberate defects a scenario switches on to prove the comparators catch them.

Each fault mimics a real bug class seen in training engines. Engines consult the plan at the few points
where such bugs live (loss normalisation, gradient reduction, model config); the worker applies the
batch- and process-level ones.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from parity.harness.contract.schema import Fault, FaultKind


class InjectedCrash(RuntimeError):
    """Raised by the 'crash' fault."""


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """The faults of one scenario, queried by (kind, rank, step)."""

    faults: tuple[Fault, ...] = ()
    rank: int = 0

    def active(self, kind: FaultKind, step: int | None = None) -> Fault | None:
        for fault in self.faults:
            if fault.kind != kind:
                continue
            if fault.rank is not None and fault.rank != self.rank:
                continue
            if fault.step is not None and step is not None and fault.step != step:
                continue
            return fault
        return None

    def has(self, kind: FaultKind) -> bool:
        return any(f.kind == kind for f in self.faults)

    def loss_scale(self, step: int) -> float:
        """rank_loss_scale: this rank's contribution to the gradient reduction scaled (0 = dropped)."""
        fault = self.active("rank_loss_scale", step)
        return fault.factor if fault else 1.0

    def normalizer(self, global_tokens: float, local_tokens: float) -> float:
        """local_token_norm: divide by this shard's token count instead of the global one. loss_normalizer_scale:
        by the global count times the fault's factor (a count a few tokens off scales the loss and every gradient)."""
        if self.active("local_token_norm"):
            return max(local_tokens, 1.0)
        scaled = self.active("loss_normalizer_scale")
        return global_tokens * scaled.factor if scaled else global_tokens

    def scale_grads(self, grads: Iterable[Any], step: int) -> None:
        """grad_scale: every gradient multiplied on one step (hidden by Adam and clipping: only the
        pre-clip grad norm shows it). nondeterministic: gradients scaled by 1 + ~1e-6 drawn from the OS entropy
        pool, as an unordered atomic reduction would perturb them (far below every tolerance; only the
        deterministic lane, `repeat:`, sees it)."""
        fault = self.active("grad_scale", step)
        noise = self.active("nondeterministic", step)
        if fault or noise:
            factor = (fault.factor if fault else 1.0) * (1.0 + 1e-6 * random.SystemRandom().random() if noise else 1.0)
            for grad in grads:
                if grad is not None:
                    grad.mul_(factor)

    def scale_group_grads(self, named_grads: Iterable[tuple[str, Any]], group_of: Callable[[str], str],
                          step: int) -> None:
        """module_grad_scale: the gradients of ONE parameter group (`key`, HF naming) multiplied on one step, as a
        module-local gradient bug would (a missed reduction in one layer): only the per-group fingerprint says
        where."""
        fault = self.active("module_grad_scale", step)
        if fault:
            for name, grad in named_grads:
                if grad is not None and group_of(name) == fault.key:
                    grad.mul_(fault.factor)

    def skips_optimizer_step(self, step: int) -> bool:
        """optimizer_step_skip: the optimizer is not stepped on this step (a swallowed inf check, a scheduler
        off by one): only the optimizer's own step count shows it when the update is small."""
        return self.active("optimizer_step_skip", step) is not None

    def patch_hf_config(self, config: Any) -> None:
        """rope_theta_int: rope_theta truncated to an integer, as `int(config.rope_theta)` would."""
        if self.active("rope_theta_int"):
            from parity.harness.contract.hf_config import get_rope_theta, set_rope_theta

            set_rope_theta(config, int(get_rope_theta(config)))

    def before_step(self, step: int) -> None:
        """crash / hang: a rank dies or blocks at a step (the launcher must contain both)."""
        if self.active("crash", step):
            raise InjectedCrash(f"injected crash on rank {self.rank} at step {step}")
        if self.active("hang", step):
            print(f"injected hang on rank {self.rank} at step {step} (pid {os.getpid()})", flush=True)
            while True:
                time.sleep(60)
