"""`hf`: a transformers causal LM in one process — the reference engine (cpu / cuda / npu by argument)."""

from __future__ import annotations

import torch

from engines.base import Engine, StepOutput, TokenOutputs
from engines.hf_common import autocast, load_hf_model, make_optimizer, model_inputs, response_logits
from harness.losses import logprobs_and_entropy, masked_loss_sum
from harness.workload import Batch


class HFEngine(Engine):
    """Plain single-process training: the thing every parallel engine must reproduce."""

    def setup(self) -> None:
        if self.ctx.world_size != 1:
            raise ValueError(f"the hf engine runs on one rank; this scenario has world size {self.ctx.world_size}")
        self.model = load_hf_model(self.ctx)
        self.optimizer = make_optimizer(self.model.parameters(), self.ctx.scenario.workload)

    def _score(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast(self.ctx):
            logits = self.model(**model_inputs(batch, self.ctx.device)).logits
        labels = batch.response_labels().to(self.ctx.device)
        return logprobs_and_entropy(response_logits(logits, batch.prompt_len), labels)

    @torch.no_grad()
    def forward(self, batch: Batch) -> TokenOutputs:
        self.model.eval()
        logprobs, entropy = self._score(batch)
        return TokenOutputs(logprobs=logprobs.cpu(), entropy=entropy.cpu())

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        logprobs, entropy = self._score(batch)
        mask = batch.response_mask.to(self.ctx.device)
        tokens = float(mask.sum())
        loss = masked_loss_sum(self.ctx.scenario.workload, logprobs, entropy, old_logprobs.to(self.ctx.device),
                               batch.advantages.to(self.ctx.device), mask,
                               self.ctx.faults.normalizer(tokens, tokens))
        (loss * self.ctx.faults.loss_scale(step)).backward()
        self.ctx.faults.scale_grads((p.grad for p in self.model.parameters()), step)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.ctx.scenario.workload.grad_clip)
        self.optimizer.step()
        return StepOutput(loss=float(loss), grad_norm=float(grad_norm))
