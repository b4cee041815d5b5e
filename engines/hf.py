"""`hf`: a transformers causal LM in one process — the reference engine (cpu / cuda / npu by argument).

Low precision comes in two recipes (engine_kwargs `precision`), because parallel engines differ in which one
they follow and the three-way lane must compare like with like:
- `autocast` (default): fp32 weights, bf16/fp16 compute at the autocast ops — HF Trainer / Accelerate's recipe.
- `master_weights`: the model's weights in bf16/fp16, fp32 master copies in the optimizer — FSDP2's
  MixedPrecisionPolicy(param_dtype=bf16) (it casts the fp32 sharded parameters to bf16 for compute), Megatron's and
  MindSpeed's recipe, where an Adam update below half a ulp of the low-precision weight is lost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from parity.engines.feeds import packed_feed, unpack
from parity.engines.hf_common import (
    HF_STATE,
    RouterLoads,
    autocast,
    hf_state_to_checkpoint,
    load_hf_model,
    make_optimizer,
    make_scheduler,
    model_inputs,
    param_group_lrs,
    response_logits,
    save_hf_state,
    step_scheduler,
)
from parity.engines.specs import HF
from parity.harness.contract import grad_groups
from parity.harness.contract.engine import DTYPE_NAMES, Engine, StepOutput, TokenOutputs
from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.fingerprint import Points, hf_points
from parity.harness.contract.losses import logprobs_and_entropy, masked_loss_sum
from parity.harness.contract.optim_state import torch_optimizer_steps, zero_adam_moments
from parity.harness.contract.workload import Batch

PRECISIONS = ("autocast", "master_weights")


class HFEngine(Engine):
    """Plain single-process training: the thing every parallel engine must reproduce."""

    spec = HF

    def setup(self) -> None:
        if self.ctx.world_size != 1:
            raise ValueError(f"the hf engine runs on one rank; this scenario has world size {self.ctx.world_size}")
        self.precision = self.ctx.scenario.engine_kwargs.get("precision", "autocast")
        if self.precision not in PRECISIONS:
            raise ValueError(f"engine_kwargs.precision={self.precision!r}: use one of {', '.join(PRECISIONS)}")
        self.model = load_hf_model(self.ctx)
        self.masters: list[torch.Tensor] | None = None
        if self.precision == "master_weights" and self.ctx.scenario.dtype != "fp32":
            self.masters = [p.detach().clone().requires_grad_(True) for p in self.model.parameters()]
            self.model.to(self.ctx.dtype)
        names = [name for name, _ in self.model.named_parameters()]
        trained = self.masters or list(self.model.parameters())
        self.optimizer = make_optimizer(zip(names, trained, strict=True), self.ctx.scenario.workload, self.ctx.faults)
        self.scheduler = make_scheduler(self.optimizer, self.ctx.scenario.workload, self.ctx.faults)
        self.loads = RouterLoads(self.model)

    def applied_kwargs(self) -> dict[str, Any]:
        given = self.ctx.scenario.engine_kwargs
        return {"engine_kwargs": {"precision": self.precision}} if "precision" in given else {}

    def effective_dtype(self) -> str | None:
        """The dtype the model's logits came out in (autocast or the weights' own dtype)."""
        return DTYPE_NAMES.get(getattr(self, "computed_dtype", None))

    def _score(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, R] log-probs and entropy of the response tokens, fed padded or packed (one [1, T] stream)."""
        precision = autocast(self.ctx) if self.masters is None else torch.autocast(self.ctx.device.type,
                                                                                    enabled=False)
        if self.ctx.scenario.workload.packed:
            feed = packed_feed(batch, torch.arange(batch.input_ids.shape[0]), faults=self.ctx.faults)
            with precision:
                logits = self.model(input_ids=feed.tokens.to(self.ctx.device),
                                    position_ids=feed.positions.to(self.ctx.device)).logits
            self.computed_dtype = logits.dtype
            scores = logprobs_and_entropy(logits[0], feed.labels[0].to(self.ctx.device))
            return tuple(unpack(batch, feed, values)[:, batch.prompt_len - 1:-1] for values in scores)
        with precision:
            logits = self.model(**model_inputs(batch, self.ctx.device)).logits
        self.computed_dtype = logits.dtype
        labels = batch.response_labels().to(self.ctx.device)
        return logprobs_and_entropy(response_logits(logits, batch.prompt_len), labels)

    def fingerprint_points(self) -> Points:
        return hf_points(self.model)

    @torch.no_grad()
    def forward(self, batch: Batch) -> TokenOutputs:
        self.model.eval()
        logprobs, entropy = self._score(batch)
        return TokenOutputs(logprobs=logprobs.cpu(), entropy=entropy.cpu())

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput:
        self.model.train()
        self.model.zero_grad(set_to_none=True)
        self.optimizer.zero_grad(set_to_none=True)
        # packed, every fed token is one of the batch's real ones
        real = torch.ones(int(batch.attention_mask.sum())) if self.ctx.scenario.workload.packed \
            else batch.attention_mask
        with self.loads.counting(real):
            logprobs, entropy = self._score(batch)
        mask = batch.response_mask.to(self.ctx.device)
        tokens = float(mask.sum())
        loss = masked_loss_sum(self.ctx.scenario.workload, logprobs, entropy, old_logprobs.to(self.ctx.device),
                               batch.advantages.to(self.ctx.device), mask,
                               self.ctx.faults.normalizer(tokens, tokens), sequences=float(mask.shape[0]))
        (loss * self.ctx.faults.loss_scale(step)).backward()
        trained = self.masters or list(self.model.parameters())
        if self.masters is not None:
            for master, param in zip(self.masters, self.model.parameters(), strict=True):
                master.grad = None if param.grad is None else param.grad.float()
        self.ctx.faults.scale_grads((p.grad for p in trained), step)
        names = [name for name, _ in self.model.named_parameters()]
        named = [(name, p.grad) for name, p in zip(names, trained, strict=True)]
        self.ctx.faults.scale_group_grads(named, grad_groups.hf_group, step)
        groups = grad_groups.named_grad_norms(named)
        grad_norm = torch.nn.utils.clip_grad_norm_(trained, self.ctx.scenario.workload.grad_clip)
        lrs = param_group_lrs(self.optimizer)
        if not self.ctx.faults.skips_optimizer_step(step):
            self.optimizer.step()
        step_scheduler(self.scheduler, self.ctx.faults, step)
        if self.masters is not None:
            with torch.no_grad():
                for master, param in zip(self.masters, self.model.parameters(), strict=True):
                    param.copy_(master)
        return StepOutput(loss=float(loss), grad_norm=float(grad_norm), group_grad_norms=groups,
                          expert_load=self.loads.take(), lr=lrs)

    def optimizer_steps(self) -> int | None:
        return torch_optimizer_steps(self.optimizer)

    # ---- its checkpoint: torch.save of the model, optimizer and scheduler state --------------------------------
    def save_checkpoint(self, directory: Path) -> None:
        save_hf_state(directory, self.model, self.optimizer, self.scheduler, self.masters)

    def load_checkpoint(self, directory: Path) -> None:
        state = torch.load(directory / HF_STATE, weights_only=False)
        self.model.load_state_dict(state["model"])
        if self.masters is not None:
            with torch.no_grad():
                for master, saved in zip(self.masters, state["masters"], strict=True):
                    master.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ctx.faults.active("resume_adam_moments_zeroed"):
            zero_adam_moments(self.optimizer)

    @classmethod
    def convert_checkpoint(cls, directory: Path, hf_dir: Path, base: Path, faults: FaultPlan) -> None:
        """The model state is in HF names already: written as an HF checkpoint (fp32 master weights where the run
        kept them)."""
        import transformers

        state = torch.load(directory / HF_STATE, weights_only=False)
        weights = state["model"]
        if state["masters"] is not None:
            weights = dict(zip(weights, state["masters"], strict=True))
        hf_state_to_checkpoint(weights, transformers.AutoConfig.from_pretrained(base), hf_dir)
