"""A third-party engine in under 60 lines: a plain transformers model, one process, plain AdamW.

A scenario runs it with `engine: "parity.examples.plain_engine:PlainHFEngine"`. It deliberately uses
nothing from the harness but its contract (parity.harness.contract: the Engine interface and the shared loss), the
way an external framework would wrap its own training step.
"""

from __future__ import annotations

import torch
import transformers

from parity.harness.contract.engine import Engine, StepOutput, TokenOutputs
from parity.harness.contract.losses import logprobs_and_entropy, masked_loss_sum
from parity.harness.contract.spec import EngineSpec
from parity.harness.contract.workload import Batch


class PlainHFEngine(Engine):
    # optional: what the harness may check before running it (one rank, engine_kwargs only)
    spec = EngineSpec(name="plain", engine="parity.examples.plain_engine:PlainHFEngine",
                      kwargs_blocks=("engine_kwargs",), devices=("cpu", "cuda"))

    def setup(self) -> None:
        config = transformers.AutoConfig.from_pretrained(self.ctx.checkpoint)
        self.ctx.faults.patch_hf_config(config)  # lets the harness's fault self-test reach this engine too
        self.model = transformers.AutoModelForCausalLM.from_pretrained(self.ctx.checkpoint, config=config)
        wl = self.ctx.scenario.workload
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=wl.lr, weight_decay=wl.weight_decay)
        self.scale = float(self.ctx.scenario.engine_kwargs.get("loss_scale", 1.0))

    def applied_kwargs(self) -> dict:
        given = self.ctx.scenario.engine_kwargs
        return {"engine_kwargs": {"loss_scale": self.scale}} if "loss_scale" in given else {}

    def effective_dtype(self) -> str:  # optional: what the weights really are (this engine ignores `dtype`)
        return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.model.dtype]

    def _score(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            position_ids=batch.position_ids).logits
        return logprobs_and_entropy(logits[:, batch.prompt_len - 1:-1], batch.response_labels())

    @torch.no_grad()
    def forward(self, batch: Batch) -> TokenOutputs:
        logprobs, entropy = self._score(batch)
        return TokenOutputs(logprobs=logprobs, entropy=entropy)

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput:
        self.optimizer.zero_grad()
        logprobs, entropy = self._score(batch)
        tokens = float(batch.response_mask.sum())
        loss = masked_loss_sum(self.ctx.scenario.workload, logprobs, entropy, old_logprobs, batch.advantages,
                               batch.response_mask, tokens)
        (loss * self.scale).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.ctx.scenario.workload.grad_clip)
        self.optimizer.step()
        return StepOutput(loss=float(loss), grad_norm=float(grad_norm))
