"""`hf`: a transformers causal LM in one process — the reference engine (cpu / cuda / npu by argument).

Low precision comes in two recipes (engine_kwargs `precision`), because parallel engines differ in which one
they follow and the three-way lane must compare like with like:
- `autocast` (default): fp32 weights, bf16/fp16 compute at the autocast ops — HF Trainer / Accelerate's recipe.
- `master_weights`: the model's weights (not its buffers) in bf16/fp16, fp32 master copies in the optimizer — FSDP2's
  MixedPrecisionPolicy(param_dtype=bf16) (it casts the fp32 sharded parameters to bf16 for compute), Megatron's and
  MindSpeed's recipe, where an Adam update below half a ulp of the low-precision weight is lost.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from parity.engines.feeds import packed_feed, unpack
from parity.engines.hf.common import (
    HF_STATE,
    RouterLoads,
    autocast,
    hf_state_to_checkpoint,
    load_hf_model,
    model_inputs,
    save_hf_state,
)
from parity.engines.specs import HF
from parity.harness.contract import grad_groups
from parity.harness.contract.engine import DTYPE_NAMES, Engine, StepOutput, TokenOutputs
from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.fingerprint import Points, hf_points
from parity.harness.contract.optim_state import finish_resume, torch_optimizer_steps
from parity.harness.contract.schema import RL_STEP_FIELDS, Workload
from parity.harness.contract.workload import Batch
from parity.reference.losses import advantages, response_positions, step_loss, token_scores
from parity.reference.optim import build_optimizer, build_scheduler, update_plan

PRECISIONS = ("autocast", "master_weights")


def rl_step_row(workload: Workload) -> bool:
    """Whether a row runs verl's RL step (any of its fields away from the default). The classic rows train every
    step against the first forward's log-probs, the RL rows against their step's own (verl compute_log_prob)."""
    return any(getattr(workload, name) != type(workload).model_fields[name].default for name in RL_STEP_FIELDS)


def step_scheduler(scheduler: torch.optim.lr_scheduler.LRScheduler, faults: FaultPlan, step: int) -> None:
    """Once per training step (fault `lr_scheduler_double_step`: twice, as a scheduler stepped both by the engine
    and by its caller would be)."""
    for _ in range(2 if faults.active("lr_scheduler_double_step", step) else 1):
        scheduler.step()


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
            # the parameters only: FSDP2's MixedPrecisionPolicy casts parameters and Megatron keeps RoPE's inv_freq
            # an fp32 attribute (megatron/core/models/common/embeddings/rotary_pos_embedding.py), so neither rounds
            # RoPE's frequencies to bf16 as a whole-module .to(bf16) would
            for param in self.model.parameters():
                param.data = param.data.to(self.ctx.dtype)
        names = [name for name, _ in self.model.named_parameters()]
        trained = self.masters or list(self.model.parameters())
        workload = self.ctx.scenario.workload
        self.optimizer = build_optimizer(zip(names, trained, strict=True), workload, self.ctx.faults)
        self.scheduler = build_scheduler(self.optimizer, workload, self.ctx.faults)
        self.loads = RouterLoads(self.model)
        # the reference policy of the KL loss: the step-0 weights, frozen (verl's ref worker)
        self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False) if workload.use_kl_loss else None
        self.ref_logprobs: torch.Tensor | None = None

    def applied_kwargs(self) -> dict[str, Any]:
        given = self.ctx.scenario.engine_kwargs
        return {"engine_kwargs": {"precision": self.precision}} if "precision" in given else {}

    def effective_dtype(self) -> str | None:
        """The dtype the model's logits came out in (autocast or the weights' own dtype)."""
        return DTYPE_NAMES.get(getattr(self, "computed_dtype", None))

    def _score(self, batch: Batch, model: torch.nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, R] log-probs and entropy of the response tokens, fed padded or packed (one [1, T] stream)."""
        model = model or self.model
        precision = autocast(self.ctx) if self.masters is None else torch.autocast(self.ctx.device.type,
                                                                                    enabled=False)
        if self.ctx.scenario.workload.packed:
            feed = packed_feed(batch, torch.arange(batch.input_ids.shape[0]), faults=self.ctx.faults)
            with precision:
                logits = model(input_ids=feed.tokens.to(self.ctx.device),
                               position_ids=feed.positions.to(self.ctx.device)).logits
            self.computed_dtype = logits.dtype
            scores = token_scores(logits[0], feed.labels[0].to(self.ctx.device))
            return tuple(unpack(batch, feed, values)[:, batch.prompt_len - 1:-1] for values in scores)
        with precision:
            logits = model(**model_inputs(batch, self.ctx.device)).logits
        self.computed_dtype = logits.dtype
        labels = batch.response_labels().to(self.ctx.device)
        return token_scores(response_positions(logits, batch.prompt_len), labels)

    def fingerprint_points(self) -> Points:
        return hf_points(self.model)

    @torch.no_grad()
    def forward(self, batch: Batch) -> TokenOutputs:
        self.model.eval()
        logprobs, entropy = self._score(batch)
        return TokenOutputs(logprobs=logprobs.cpu(), entropy=entropy.cpu())

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput:
        """One training step: the classic harness step (one update against the first forward's log-probs), or verl's
        RL step when the workload sets any of its fields: advantages from the rewards, the step's old log-probs
        from its starting weights, ppo_epochs x mini_batches updates, the scheduler after the last."""
        workload = self.ctx.scenario.workload
        if rl_step_row(workload):
            with torch.no_grad():
                self.model.eval()
                old_logprobs = self._score(batch)[0].detach()
                if self.ref_model is not None and self.ref_logprobs is None:
                    self.ref_logprobs = self._score(batch, self.ref_model)[0].detach()
        adv = batch.advantages if batch.rewards is None else advantages(
            workload.adv_estimator, batch.rewards, batch.response_mask, workload.group_size)
        self.model.train()
        done: list[tuple[float, float]] = []
        for update in update_plan(workload):
            rows = batch.rows(update.rows)
            out = self._update(rows, old_logprobs[update.rows], adv[update.rows], step,
                               None if self.ref_logprobs is None else self.ref_logprobs[update.rows])
            done.append((out.loss, out.grad_norm))
            if update.step_scheduler:
                step_scheduler(self.scheduler, self.ctx.faults, step)
        return StepOutput(loss=out.loss, grad_norm=out.grad_norm, group_grad_norms=out.group_grad_norms,
                          expert_load=self.loads.take(), lr=out.lr, updates=done if len(done) > 1 else None)

    def _update(self, batch: Batch, old_logprobs: torch.Tensor, adv: torch.Tensor, step: int,
                ref_logprobs: torch.Tensor | None) -> StepOutput:
        """zero grad -> forward/backward of `batch`'s loss -> pre-clip grad norm -> clip -> optimizer step."""
        device = self.ctx.device
        self.model.zero_grad(set_to_none=True)
        self.optimizer.zero_grad(set_to_none=True)
        # packed, every fed token is one of the batch's real ones
        real = torch.ones(int(batch.attention_mask.sum())) if self.ctx.scenario.workload.packed \
            else batch.attention_mask
        with self.loads.counting(real):
            logprobs, entropy = self._score(batch)
        mask = batch.response_mask.to(device)
        tokens = float(mask.sum())
        loss = step_loss(self.ctx.scenario.workload, logprobs, entropy, old_logprobs.to(device), adv.to(device),
                         mask, self.ctx.faults.normalizer(tokens, tokens), float(mask.shape[0]),
                         None if ref_logprobs is None else ref_logprobs.to(device))
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
        lrs = [float(group["lr"]) for group in self.optimizer.param_groups]
        if not self.ctx.faults.skips_optimizer_step(step):
            self.optimizer.step()
        if self.masters is not None:
            with torch.no_grad():
                for master, param in zip(self.masters, self.model.parameters(), strict=True):
                    param.copy_(master)
        return StepOutput(loss=float(loss.detach()), grad_norm=float(grad_norm), group_grad_norms=groups, lr=lrs)

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
        finish_resume(self.optimizer, state["optimizer"], self.scheduler, state["scheduler"], self.ctx.faults)

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
