"""`fsdp2`: the transformers model under torch FSDP2 `fully_shard` on N ranks, with optional Ulysses sequence
parallel OR tensor parallel (2-D FSDP x TP, as torchtitan does it; engines/fsdp2/tensor_parallel.py has the plan).

Ranks are laid out as (dp, inner) with inner = ulysses or tp, fastest. With Ulysses, FSDP shards over the whole
world (as verl does), rows are split over dp and the sequence over each ulysses group. With TP, FSDP shards over
the dp dimension of a (dp, tp) device mesh, rows are split over dp and every TP rank of a dp group sees the same
rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parity.engines.feeds import Feed, packed_feed, padded_feed
from parity.engines.fsdp2 import tensor_parallel, ulysses
from parity.engines.hf.common import (
    broadcast_into_shards,
    hf_state_to_checkpoint,
    load_hf_model,
    load_on_rank0,
)
from parity.engines.specs import FSDP2
from parity.engines.training import make_optimizer, make_scheduler, param_group_lrs, step_scheduler
from parity.harness.contract import grad_groups
from parity.harness.contract.engine import DTYPE_NAMES, TORCH_DTYPES, Engine, StepOutput, TokenOutputs
from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.fingerprint import Points, hf_points
from parity.harness.contract.losses import logprobs_and_entropy, masked_loss_sum
from parity.harness.contract.optim_state import finish_resume, torch_optimizer_steps
from parity.harness.contract.parallel_dims import ParallelDims
from parity.harness.contract.workload import Batch, per_position

#: where the DCP checkpoint and the scheduler's state go in a checkpoint directory
DCP_DIR, SCHEDULER_FILE = "dcp", "scheduler.pt"


class FSDP2Engine(Engine):
    spec = FSDP2

    def setup(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dims = ParallelDims.of(self.ctx.scenario.layout)
        self.sp, self.tp, self.dp = dims.ulysses, dims.tp, dims.dp
        self.dp_rank, inner = divmod(self.ctx.rank, self.sp * self.tp)
        self.sp_rank = inner if self.sp > 1 else 0
        self.tp_rank = inner if self.tp > 1 else 0
        device = self.ctx.device.type
        if self.sp > 1:
            ulysses.register()
            self.ulysses_group = dims.build_mesh(device, ("dp", "ulysses"))["ulysses"].get_group()
        attention = ulysses.ATTN_NAME if self.sp > 1 else "sdpa"
        # verl's way (rank 0 reads, the others build on meta, tensors broadcast into the shards); under TP the
        # parallelize_module calls distribute every weight from its local value, so every rank loads it
        model, full_state = (load_on_rank0(self.ctx, attention) if self.tp == 1
                             else (load_hf_model(self.ctx, attention), None))
        settings = self.fully_shard_settings(self.ctx.scenario.fsdp_kwargs)
        mp = MixedPrecisionPolicy(param_dtype=settings["param_dtype"], reduce_dtype=settings["reduce_dtype"])
        if self.tp > 1:
            mesh = dims.build_mesh(device, ("dp", "tp"))
            tensor_parallel.parallelize_decoder(model, mesh["tp"])
            self.tp_group = mesh["tp"].get_group()
            mesh = mesh["dp"]
        else:  # FSDP shards over the whole world, the Ulysses ranks too (verl's way)
            mesh = init_device_mesh(device, (self.ctx.world_size,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=settings["reshard_after_forward"])
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=settings["reshard_after_forward"])
        if self.tp == 1:
            broadcast_into_shards(model, full_state, self.ctx.device)
        self.model = model
        # after fully_shard, which replaces every parameter with its sharded DTensor
        self.tp_partial = tensor_parallel.partial_grad_params(model) if self.tp > 1 else []
        self.build_optimizer(model)

    def fingerprint_points(self) -> Points:
        """The HF modules; under TP (engines/tensor_parallel.py) every block's output is replicated on the TP
        ranks, the logits too."""
        points = hf_points(self.model)
        points.replicas, points.whole_replicated = self.tp, frozenset(points.modules)
        return points

    def build_optimizer(self, model: torch.nn.Module) -> None:
        """The workload's optimizer and schedule over the sharded parameters (after fully_shard, which replaces
        every parameter with its DTensor: the weight-decay rule reads each one's full ndim)."""
        self.optimizer = make_optimizer(model.named_parameters(), self.ctx.scenario.workload, self.ctx.faults)
        self.scheduler = make_scheduler(self.optimizer, self.ctx.scenario.workload, self.ctx.faults)

    def fully_shard_settings(self, given: dict[str, Any]) -> dict[str, Any]:
        """fully_shard arguments from fsdp_kwargs over the scenario's defaults; unknown keys are not used
        (and so never reported as applied: the propagation check fails them)."""
        return {
            "reshard_after_forward": bool(given.get("reshard_after_forward", True)),
            "param_dtype": TORCH_DTYPES[given.get("param_dtype", self.ctx.scenario.dtype)],
            "reduce_dtype": TORCH_DTYPES[given.get("reduce_dtype", "fp32")],
        }

    def applied_kwargs(self) -> dict[str, Any]:
        """Read back from the FSDP state of the first layer, not from what was asked for."""
        group = self.model.model.layers[0]._get_fsdp_state()._fsdp_param_group
        effective = {"reshard_after_forward": group.post_forward_mesh_info is not None,
                     "param_dtype": DTYPE_NAMES[group.mp_policy.param_dtype or torch.float32],
                     "reduce_dtype": DTYPE_NAMES[group.mp_policy.reduce_dtype or torch.float32]}
        given = self.ctx.scenario.fsdp_kwargs
        return {"fsdp_kwargs": {k: v for k, v in effective.items() if k in given}} if given else {}

    def effective_dtype(self) -> str | None:
        """FSDP2 computes in its mixed-precision policy's param_dtype (read back from the first layer's state)."""
        group = self.model.model.layers[0]._get_fsdp_state()._fsdp_param_group
        return DTYPE_NAMES[group.mp_policy.param_dtype or torch.float32]

    # ---- feeding the global batch -----------------------------------------------------------------
    def _feed(self, batch: Batch) -> Feed:
        """This rank's model input: its dp rows, padded (its sequence slice under Ulysses) or packed."""
        rows = batch.input_ids.shape[0] // self.dp
        mine = torch.arange(self.dp_rank * rows, (self.dp_rank + 1) * rows)
        if self.ctx.scenario.workload.packed:
            return packed_feed(batch, mine, self.sp, self.sp_rank, self.ctx.faults)
        return padded_feed(batch, mine, self.sp, self.sp_rank)

    def _score_local(self, feed: Feed) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs/entropy for this rank's positions (position i scores token i+1)."""
        device = self.ctx.device
        context = {ulysses.KWARG: ulysses.UlyssesState(self.ulysses_group, feed.key_padding, feed.stream_positions)
                   } if self.sp > 1 else {}
        mask = feed.attention_mask.to(device) if feed.attention_mask is not None and self.sp == 1 else None
        logits = self.model(input_ids=feed.tokens.to(device), attention_mask=mask,
                            position_ids=feed.positions.to(device), **context).logits
        return logprobs_and_entropy(logits, feed.labels.to(device))

    @torch.no_grad()
    def forward(self, batch: Batch) -> TokenOutputs | None:
        self.model.eval()
        feed = self._feed(batch)
        logprobs, entropy = self._score_local(feed)
        whole = [self._assemble(batch, feed, t) for t in (logprobs, entropy)]
        if self.ctx.rank != 0:
            return None
        full_lp, full_ent = (t[:, batch.prompt_len - 1:-1] for t in whole)
        return TokenOutputs(logprobs=full_lp, entropy=full_ent)

    def _assemble(self, batch: Batch, feed: Feed, values: torch.Tensor) -> torch.Tensor:
        """Whole [B, S] values on every rank: each (row, column) is scored by exactly one rank of the dp x inner
        grid (TP peers hold copies: tp rank 0 writes), so a SUM all-reduce of zero-filled tensors is exact."""
        full = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        if self.tp_rank == 0:
            full[feed.row[feed.real], feed.col[feed.real]] = values.detach().float().cpu()[feed.real]
        full = full.to(self.ctx.device)
        dist.all_reduce(full)
        return full.cpu()

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput | None:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._local_loss(batch, old_logprobs)
        faults = self.ctx.faults
        # the gradient reduction averages over `grad_average_ranks`: scale so the sum is the global token-mean
        (loss * self.grad_average_ranks() * faults.loss_scale(step)).backward()
        self.after_backward(step)
        faults.scale_grads((p.grad for p in self.model.parameters()), step)
        named = [(name, p.grad) for name, p in self.model.named_parameters()]
        faults.scale_group_grads(((n, g if g is None else tensor_parallel.local(g)) for n, g in named),
                                 grad_groups.hf_group, step)
        groups = tensor_parallel.group_grad_norms(named)
        grad_norm = self.clip_grads(self.ctx.scenario.workload.grad_clip)
        lrs = param_group_lrs(self.optimizer)
        if not faults.skips_optimizer_step(step):
            self.optimizer.step()
        step_scheduler(self.scheduler, faults, step)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if self.ctx.rank != 0:
            return None
        return StepOutput(loss=float(total) / self.loss_replicas(), grad_norm=grad_norm, group_grad_norms=groups,
                          lr=lrs)

    def optimizer_steps(self) -> int | None:
        return torch_optimizer_steps(self.optimizer)

    # ---- its checkpoint: torch Distributed Checkpoint (DCP) of the sharded model and optimizer ------------------
    def save_checkpoint(self, directory: Path) -> None:
        """Model and optimizer state as DTensor shards through torch.distributed.checkpoint (each rank writes its
        own; DCP reshards on load), the scheduler's state (the same on every rank) from rank 0."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(directory / DCP_DIR))
        if self.ctx.rank == 0:
            torch.save(self.scheduler.state_dict(), directory / SCHEDULER_FILE)

    def load_checkpoint(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=str(directory / DCP_DIR))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        finish_resume(self.optimizer, None, self.scheduler,
                      torch.load(directory / SCHEDULER_FILE, weights_only=False), self.ctx.faults)

    @classmethod
    def convert_checkpoint(cls, directory: Path, hf_dir: Path, base: Path, faults: FaultPlan) -> None:
        """DCP -> one torch state dict in one process (torch's dcp_to_torch_save), whose model entries are the HF
        names FSDP2 keeps, written as an HF checkpoint."""
        import tempfile

        import transformers
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            whole = Path(tmp) / "whole.pt"
            dcp_to_torch_save(directory / DCP_DIR, whole)
            model_state = torch.load(whole, weights_only=False)["model"]
        hf_state_to_checkpoint(model_state, transformers.AutoConfig.from_pretrained(base), hf_dir)

    def run_provenance(self) -> dict[str, Any]:
        """How the batch reached the model: padded rows with their mask, or one packed stream whose sequences the
        attention finds from the position ids; the attention implementation transformers ran."""
        packed = self.ctx.scenario.workload.packed
        config = getattr(self.model, "config", None) or getattr(getattr(self.model, "model", None), "config", None)
        return {"data_path": {
            "packing": self.ctx.scenario.workload.packing,
            "attention": getattr(config, "_attn_implementation", None),
            "attention_mask": "none: sequences from restarting position ids" if packed
            else "[b, s] padding mask" if self.sp == 1 else "[b, s] padding mask of the whole rows (Ulysses)"}}

    def _local_loss(self, batch: Batch, old_logprobs: torch.Tensor) -> torch.Tensor:
        """This rank's share of the token-mean loss over its rows and sequence slice (or packed tokens)."""
        feed = self._feed(batch)
        mask, old, adv = (feed.take(per_position(batch, values.float())) for values in
                          (batch.response_mask, old_logprobs.cpu(), batch.advantages))
        logprobs, entropy = self._score_local(feed)
        device = self.ctx.device
        normalizer = self.ctx.faults.normalizer(float(batch.response_mask.sum()), float(mask.sum()))
        return masked_loss_sum(self.ctx.scenario.workload, logprobs, entropy, old.to(device), adv.to(device),
                               mask.to(device), normalizer)

    def grad_average_ranks(self) -> int:
        """FSDP shards (and averages gradients) over the whole world, or over dp alone under TP."""
        return self.ctx.world_size // self.tp

    def after_backward(self, step: int) -> None:
        """Gradient reductions the wrappers leave out: under TP, the partial gradients of replicated parameters
        fed head-sharded activations (Qwen3's q/k norms) are summed over the TP group."""
        if self.tp > 1 and not self.ctx.faults.active("tp_grad_reduce_skip", step):
            tensor_parallel.reduce_partial_grads(self.tp_partial, self.tp_group)

    def clip_grads(self, max_norm: float) -> float:
        """Clip and return the norm BEFORE clipping (under TP the parameters live on two meshes, which torch's
        clip_grad_norm_ cannot stack)."""
        if self.tp > 1:
            return tensor_parallel.clip_grad_norm(self.model.parameters(), max_norm)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)

    def loss_replicas(self) -> int:
        """How many ranks hold the same loss share (summed over the world, then divided by this): TP peers."""
        return self.tp
