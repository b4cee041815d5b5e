"""`megatron`: a Megatron-Core GPTModel built from the HF checkpoint, trained by Megatron's own machinery —
`get_forward_backward_func` schedules (1F1B, interleaved), DistributedDataParallel + finalize_model_grads,
`get_megatron_optimizer` (optionally distributed), its RNG tracker — on any TP / SP / PP / VPP / CP / EP / ETP
layout. On CPU the `cpu_compat` shim makes the same code run with gloo.

Loss normalisation: the shared workload loss divides each rank's token sum by the GLOBAL real-token count,
Megatron sums gradients over dp x cp (calculate_per_token_loss) and finalize_model_grads is called without
its own token rescale, so the gradient is exactly the global token-mean's.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parity.engines.megatron import compat
from parity.engines.megatron.batching import CPSplit, MicroBatch, assemble, micro_batches, packed_micro_batches
from parity.engines.megatron.config import (
    SCHEDULE_DEFAULTS,
    RoutedKwargs,
    expert_tensor_parallel,
    read_back,
    route_mcore_kwargs,
    transformer_kwargs,
    unsupported,
)
from parity.engines.megatron.convert import ModelArch
from parity.engines.megatron.faults import apply_tp_allreduce_skip, stage_grad_factor
from parity.engines.megatron.grad_groups import group_grad_norms, named_main_grads
from parity.engines.megatron.moe_load import RouterLoads, accepts_padding_mask
from parity.engines.megatron.packing import THDSplit, alignment_padding, te_thd_split, thd_alignment
from parity.engines.specs import MEGATRON
from parity.harness.contract.engine import DTYPE_NAMES, Engine, StepOutput, TokenOutputs
from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.losses import masked_loss_sum
from parity.harness.contract.optim_state import finish_resume, torch_optimizer_steps
from parity.harness.contract.workload import Batch

#: Megatron pads the vocabulary to a multiple of this times TP (its `make_vocab_size_divisible_by` default)
VOCAB_DIVISOR = 128
#: the dist-ckpt's directory in a checkpoint directory
DIST_CKPT_DIR = "dist_ckpt"


def vocab_parallel_log_probs(shard: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) from [..., V / tp] logits: minus Megatron's vocab_parallel_cross_entropy (which shifts its input
    in place: it gets a copy)."""
    from megatron.core import tensor_parallel

    return -tensor_parallel.vocab_parallel_cross_entropy(shard.float().clone(), labels)


def vocab_parallel_entropy(shard: torch.Tensor) -> torch.Tensor:
    """H = max + log sum exp(z - max) - sum softmax(z) z over the whole vocabulary, from [..., V / tp] logits: the
    sums reduced over TP with Megatron's reduce_from_tensor_model_parallel_region (all-reduce forward, identity
    backward: each rank's share of a sum differentiates locally); the max detached (H does not depend on it)."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    z = shard.float()
    top = z.detach().max(dim=-1, keepdim=True).values
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group())
    exp = torch.exp(z - top)
    total = tensor_parallel.reduce_from_tensor_model_parallel_region(exp.sum(dim=-1, keepdim=True))
    weighted = tensor_parallel.reduce_from_tensor_model_parallel_region((exp * z).sum(dim=-1, keepdim=True))
    return (top + total.log() - weighted / total).squeeze(-1)


def finalize_grads_without_token_rescale(model: list[Any], num_tokens: Any = None, **kwargs: Any) -> None:
    """finalize_model_grads (dp x cp reduction, SP norm / embedding all-reduces) minus the division by the
    token count: the loss is already divided by the global count. The keywords are whatever this release's
    schedule passes (none up to 0.13, `grad_finalize_pgs` in 0.14, `pg_collection` from 0.15, `force_all_reduce`
    from 0.16): handed on as they came."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model, None, **kwargs)


class MegatronEngine(Engine):
    """Subclass hooks: `prepare_megatron()` runs before Megatron initialises (MindSpeed patches Megatron there);
    `transformer_config_kwargs()` is the TransformerConfig a subclass may extend; `use_transformer_engine()` and
    `context_parallel_attention()` choose the layer spec; `cp_split()` / `thd_split()` how a padded / packed
    micro-batch is split over CP."""

    spec = MEGATRON

    # ---- hooks ---------------------------------------------------------------------------------------------
    def prepare_megatron(self) -> None:
        """Runs after the CPU shim and before `initialize_model_parallel`. Nothing to do here."""

    def transformer_config_kwargs(self) -> dict[str, Any]:
        kwargs = transformer_kwargs(self.arch, self.hf_config, self.ctx.scenario.layout, self.ctx.scenario.dtype,
                                    self.on_cpu)
        if self.packed and self.ctx.scenario.layout.pp > 1:
            # each THD micro-batch has its own length: pipeline stages exchange shapes (as verl sets). Megatron
            # refuses that with the allgather token dispatcher, even for a dense model, which has no dispatcher
            kwargs["variable_seq_lengths"] = True
            if not self.arch.num_experts:
                kwargs["moe_token_dispatcher_type"] = "alltoall"
        return {**kwargs, **self.routed.transformer}

    @property
    def packed(self) -> bool:
        return self.ctx.scenario.workload.packed

    def use_transformer_engine(self) -> bool:
        """TE spec where TE imports, off CPU; padded rows only without CP: their left padding needs an arbitrary
        mask, which TE's context-parallel attention does not take (packed THD rows need none)."""
        from parity.engines.megatron.model import have_transformer_engine

        return not self.on_cpu and (self.packed or self.ctx.scenario.layout.cp == 1) and have_transformer_engine()

    def context_parallel_attention(self) -> type | None:
        """Core attention for the local spec where Megatron's local one refuses the run: packed THD micro-batches
        (`THDAttention`, any cp) or padded rows with CP > 1 (`CPGatherAttention`). A subclass whose framework
        patches its own attention in returns None."""
        from parity.engines.megatron.cp_attention import CPGatherAttention, THDAttention

        if self.packed:
            return THDAttention
        return CPGatherAttention if self.ctx.scenario.layout.cp > 1 else None

    def cp_split(self) -> CPSplit | None:
        """How a padded micro-batch is split over CP ranks, mask included (None: Megatron's load-balanced
        `get_batch_on_this_cp_rank`, which the CPU gather attention and TE's CP attention expect)."""
        return None

    def thd_split(self) -> THDSplit:
        """How a packed micro-batch is split over CP ranks: Megatron's THD split (TE's partition of each
        sequence into 2·cp chunks, engines/megatron/packing.py)."""
        from megatron.core import parallel_state

        return te_thd_split(parallel_state.get_context_parallel_world_size(),
                            parallel_state.get_context_parallel_rank(), self.ctx.faults)

    def _micro_batches(self, batch: Batch, old_logprobs: torch.Tensor | None) -> list[MicroBatch]:
        dp, dp_rank = self._coords()
        size = self.schedule["micro_batch_size"]
        if self.packed:
            layout = self.ctx.scenario.layout
            return packed_micro_batches(batch, old_logprobs, dp, dp_rank, size, self.ctx.device,
                                        thd_alignment(layout.tp, layout.cp), self.thd_split(), self.ctx.faults)
        return micro_batches(batch, old_logprobs, dp, dp_rank, size, self.ctx.device, self.cp_split())

    def normalizer(self, batch: Batch, local_tokens: float) -> float:
        """The global real-response-token count (verl's token mean). Fault `pad_tokens_in_normalizer`: a packed
        run counts the tp·cp·2 alignment tokens of every packed sequence as well."""
        count = float(batch.response_mask.sum())
        if self.packed and self.ctx.faults.active("pad_tokens_in_normalizer"):
            layout = self.ctx.scenario.layout
            count += alignment_padding(batch.attention_mask.sum(1), thd_alignment(layout.tp, layout.cp))
        return self.ctx.faults.normalizer(count, local_tokens)

    # ---- setup ---------------------------------------------------------------------------------------------
    def setup(self) -> None:
        import transformers
        from megatron.core import parallel_state, tensor_parallel

        from parity.engines.megatron.cpu_compat import CpuCompat
        from parity.harness.contract.hf_config import get_rope_theta

        ctx, layout = self.ctx, self.ctx.scenario.layout
        compat.require_supported_version()
        self.cpu_stand_ins: list[str] = []  # what ran in place of device-only code, for the record
        if layout.ulysses > 1:
            raise ValueError("the megatron engine has no Ulysses; use layout.cp for context parallel")
        self.on_cpu = ctx.device.type == "cpu"
        self._shim = CpuCompat() if self.on_cpu else None
        if self._shim is not None:
            self._shim.apply()
        self.prepare_megatron()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
            context_parallel_size=layout.cp, expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=expert_tensor_parallel(layout))
        tensor_parallel.model_parallel_cuda_manual_seed(ctx.scenario.workload.seed)

        self.hf_config = transformers.AutoConfig.from_pretrained(ctx.checkpoint)
        ctx.faults.patch_hf_config(self.hf_config)
        if problems := unsupported(self.hf_config):
            raise NotImplementedError(f"the megatron engine cannot map {ctx.checkpoint}: {'; '.join(problems)}")
        self.arch = ModelArch.from_hf_config(self.hf_config, vocab_divisor=VOCAB_DIVISOR * layout.tp)
        # drop_kwarg fault: the key vanishes silently (no warning, not reported) like a renamed key would
        self._dropped = {f.key for f in ctx.scenario.faults if f.kind == "drop_kwarg"}
        self.routed: RoutedKwargs = route_mcore_kwargs(
            {k: v for k, v in ctx.scenario.mcore_kwargs.items() if k not in self._dropped})
        self._warn_rejected()
        self.schedule = {**SCHEDULE_DEFAULTS, **self.routed.schedule}
        self._build(get_rope_theta(self.hf_config))

    def _warn_rejected(self) -> None:
        if self.ctx.rank == 0:
            for key, why in self.routed.rejected.items():
                print(f"WARNING: mcore_kwargs '{key}' NOT applied: {why}", file=sys.stderr, flush=True)

    def _build(self, rope_theta: float) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module
        from megatron.core.transformer.transformer_config import TransformerConfig

        from parity.engines.megatron.hf_weights import SafetensorsCheckpoint
        from parity.engines.megatron.model import build_chunks, current_shard, load_hf_weights, load_main_params

        ctx, workload = self.ctx, self.ctx.scenario.workload
        self.config = TransformerConfig(**self.transformer_config_kwargs())
        use_te = self.use_transformer_engine()
        chunks = build_chunks(self.config, self.arch, rope_theta, use_te,
                              None if use_te else self.context_parallel_attention(), workload.seq_len,
                              arbitrary_mask=not self.packed)
        checkpoint, shard = SafetensorsCheckpoint(ctx.checkpoint), current_shard()
        # checkpoint tensors wider than the (bf16 / fp16) params: they become the optimizer's fp32 main params
        unrounded: dict[torch.nn.Parameter, torch.Tensor] = {}
        for chunk in chunks:
            chunk.to(ctx.device)
            unrounded.update(load_hf_weights(chunk, checkpoint, self.arch, shard, ctx.faults.has("qkv_interleave")))
        apply_tp_allreduce_skip(ctx.faults, chunks)
        if self.config.bf16 or self.config.fp16:
            chunks = [Float16Module(self.config, chunk) for chunk in chunks]
        self.ddp_config = DistributedDataParallelConfig(
            **{"grad_reduce_in_fp32": True, "overlap_grad_reduce": False, **self.routed.ddp})
        self.model = [DistributedDataParallel(self.config, self.ddp_config, chunk, disable_bucketing=i > 0)
                      for i, chunk in enumerate(chunks)]
        self.config.finalize_model_grads_func = finalize_grads_without_token_rescale
        sgd = workload.optimizer == "sgd"
        self.optimizer_config = OptimizerConfig(**{
            # torch.optim.AdamW's numerics: decoupled weight decay, default betas, eps 1e-8; plain SGD
            "optimizer": "sgd" if sgd else "adam", "lr": workload.lr,
            "min_lr": workload.min_lr_ratio * workload.lr,
            "weight_decay": workload.weight_decay, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8,
            **compat.adamw_kwargs(), "sgd_momentum": 0.0, "clip_grad": workload.grad_clip,
            "bf16": self.config.bf16, "fp16": self.config.fp16, "params_dtype": self.config.params_dtype,
            "use_distributed_optimizer": self.ddp_config.use_distributed_optimizer, **self.routed.optimizer})
        # the workload's weight-decay groups: Megatron's own default param groups exempt biases and 1-D params (norm
        # weights); `weight_decay_exempt: none` (and fault `weight_decay_on_norms`) decays every parameter, as
        # torch.optim.AdamW over model.parameters()
        decay_all = workload.weight_decay_exempt == "none" or ctx.faults.active("weight_decay_on_norms")
        self.optimizer = get_megatron_optimizer(self.optimizer_config, self.model,
                                                **(compat.decay_every_param_kwargs() if decay_all else {}))
        self.scheduler = self.build_scheduler()
        # Megatron copies its fp32 main params from the 16-bit model params; start them from the checkpoint's
        # exact values instead, as a resume does (and as the hf_master_weights baseline does)
        if unrounded and self.optimizer_config.use_precision_aware_optimizer:
            if ctx.rank == 0:
                print("WARNING: use_precision_aware_optimizer keeps the fp32 main params inside the fused "
                      "optimizer: they start from the 16-bit model params, not the checkpoint's values",
                      file=sys.stderr, flush=True)
        else:
            loaded = load_main_params(self.optimizer, unrounded)
            # the distributed optimizer holds only this rank's shards; the others hold every main param
            if not self.ddp_config.use_distributed_optimizer and loaded != len(unrounded):
                raise RuntimeError(f"{len(unrounded) - loaded} bf16/fp16 parameters have no fp32 main param in "
                                   "the optimizer: their masters would start from the rounded weights")
        if self.config.fp16:
            self.config.grad_scale_func = self.optimizer.scale_loss
        self.loads = RouterLoads(self.model, self.arch.num_layers, self.arch.num_experts) \
            if self.arch.num_experts else None

    def build_scheduler(self) -> Any:
        """Megatron's OptimizerParamScheduler, configured as verl's Megatron engine configures it
        (verl/utils/megatron/optimizer.py get_megatron_optimizer_param_scheduler): warmup from 0, decay over the
        run's steps to min_lr_ratio x lr, constant weight decay (applied per group through its wd_mult, which is
        how Megatron's exempt groups get none). It sets every group's lr at construction (step 0) and is stepped
        once per update, as verl's `lr_scheduler_step` does (parity.harness.contract.schedule gives the numbers).
        Fault `lr_warmup_ignored`: built without the warmup."""
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        from parity.harness.contract.schedule import warmup_steps

        workload = self.ctx.scenario.workload
        warmup = 0 if self.ctx.faults.active("lr_warmup_ignored") else warmup_steps(workload)
        return OptimizerParamScheduler(
            self.optimizer, init_lr=0.0, max_lr=workload.lr, min_lr=workload.min_lr_ratio * workload.lr,
            lr_warmup_steps=warmup, lr_decay_steps=workload.steps, lr_decay_style=workload.lr_scheduler_type,
            start_wd=workload.weight_decay, end_wd=workload.weight_decay, wd_incr_steps=workload.steps,
            wd_incr_style="constant")

    def effective_dtype(self) -> str | None:
        """The dtype of the model parameters Megatron computes with (Float16Module casts them for bf16 / fp16)."""
        return DTYPE_NAMES.get(next(self.model[0].parameters()).dtype)

    def applied_kwargs(self) -> dict[str, Any]:
        given = self.ctx.scenario.mcore_kwargs
        sources = {"transformer": self.config, "ddp": self.ddp_config, "optimizer": self.optimizer_config}
        applied = {key: read_back(key, sources, self.schedule) for key in given
                   if key not in self.routed.rejected and key not in self._dropped}
        return {"mcore_kwargs": applied} if applied else {}

    # ---- running the schedule ------------------------------------------------------------------------------
    def _coords(self) -> tuple[int, int]:
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()

    def _owner(self) -> bool:
        """The rank that reports this dp x cp coordinate's per-token results: TP rank 0 of the last stage."""
        from megatron.core import parallel_state

        return compat.is_last_physical_stage() and parallel_state.get_tensor_model_parallel_rank() == 0

    def _schedule(self, micro: list[MicroBatch], loss_func: Any, forward_only: bool) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
            mb = next(data_iterator)
            extra = {} if mb.packed_seq_params is None else {"packed_seq_params": mb.packed_seq_params}
            if self.marks_padding:
                extra["padding_mask"] = mb.padding
            output = model(input_ids=mb.tokens, position_ids=mb.position_ids, attention_mask=mb.attention_mask,
                           **extra)
            return output, partial(loss_func, mb)

        # packed: every micro-batch has its own length, the stages exchange shapes (variable_seq_lengths) and the
        # shape arguments are placeholders, as verl passes them
        seq_length, rows = (1, 1) if self.packed else (self.ctx.scenario.workload.seq_len,
                                                       self.schedule["micro_batch_size"])
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=[iter(micro) for _ in self.model], model=self.model,
            num_microbatches=len(micro), seq_length=seq_length, micro_batch_size=rows, forward_only=forward_only)

    def _scores(self, mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs and entropy from this rank's vocabulary shard, never the gathered vocabulary: the
        log-probs by Megatron's own vocab-parallel cross-entropy, as verl's Megatron engine takes them
        (verl/utils/megatron/tensor_parallel.py vocab_parallel_log_probs_from_logits), the entropy vocab-parallel too
        (verl's _VocabParallelEntropy math: max, sum of exp and sum of p x logit all-reduced over TP)."""
        shard = self._real_vocab(logits)
        return vocab_parallel_log_probs(shard, mb.labels), vocab_parallel_entropy(shard)

    def _real_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """This shard's logits with the columns of Megatron's vocabulary padding (make_vocab_size_divisible_by x tp,
        zero rows of the output layer, so logit 0) at the dtype's lowest value: no token of the HF vocabulary they
        stand for, so no share of the softmax. Fault `vocab_padding_in_softmax`: left in."""
        from megatron.core import parallel_state

        if self.ctx.faults.has("vocab_padding_in_softmax"):
            return logits
        width = logits.shape[-1]
        start = parallel_state.get_tensor_model_parallel_rank() * width
        padding = torch.arange(start, start + width, device=logits.device) >= self.arch.vocab_size
        return logits.masked_fill(padding, torch.finfo(logits.dtype).min) if bool(padding.any()) else logits

    @torch.no_grad()
    def forward(self, batch: Batch) -> TokenOutputs | None:
        for chunk in self.model:
            chunk.eval()
        micro = self._micro_batches(batch, None)
        pieces: list[tuple[MicroBatch, torch.Tensor, torch.Tensor]] = []

        def loss_func(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            logprobs, entropy = self._scores(mb, logits)
            pieces.append((mb, logprobs, entropy))
            return logprobs.sum() * 0, torch.zeros([], dtype=torch.int, device=logits.device), {}

        self._schedule(micro, loss_func, forward_only=True)
        shape, owner, device = tuple(batch.input_ids.shape), self._owner(), self.ctx.device
        logprobs = assemble(shape, [(mb, lp) for mb, lp, _ in pieces], owner, device)
        entropy = assemble(shape, [(mb, ent) for mb, _, ent in pieces], owner, device)
        if self.ctx.rank != 0:
            return None
        cols = slice(batch.prompt_len - 1, -1)
        return TokenOutputs(logprobs=logprobs[:, cols], entropy=entropy[:, cols])

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput | None:
        from megatron.core import parallel_state

        ctx, workload = self.ctx, self.ctx.scenario.workload
        for chunk in self.model:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        micro = self._micro_batches(batch, old_logprobs)
        local_tokens = float(sum(mb.score_mask.sum() for mb in micro))
        normalizer = self.normalizer(batch, local_tokens)
        loss_scale = ctx.faults.loss_scale(step)
        losses: list[torch.Tensor] = []

        def loss_func(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            logprobs, entropy = self._scores(mb, logits)
            loss = masked_loss_sum(workload, logprobs, entropy, mb.old_logprobs, mb.advantages, mb.score_mask,
                                   normalizer)
            losses.append(loss.detach())
            tokens = mb.score_mask.sum().to(torch.int)
            return loss * loss_scale, tokens, {}

        if self.loads is not None:
            self.loads.active = True
        try:
            self._schedule(micro, loss_func, forward_only=False)
        finally:
            if self.loads is not None:
                self.loads.active = False
        expert_load = self.loads.collect(ctx.device) if self.loads is not None else None
        grads = [p.main_grad for chunk in self.model for p in chunk.parameters() if p.requires_grad]
        ctx.faults.scale_grads(grads, step)
        factor = stage_grad_factor(ctx.faults, step, parallel_state.get_pipeline_model_parallel_rank(),
                                   parallel_state.get_pipeline_model_parallel_world_size(), ctx.world_size)
        if factor != 1.0:
            for grad in grads:
                grad.mul_(factor)
        ctx.faults.scale_group_grads(((group, getattr(p, "main_grad", None)) for _, group, p in
                                      named_main_grads(self.model)), str, step)
        # the distributed optimizer leaves each rank only its shard of the reduced main_grad: no fingerprint there
        groups = None if self.ddp_config.use_distributed_optimizer else group_grad_norms(self.model)
        lrs = [float(group["lr"]) for group in self.optimizer.param_groups]
        if ctx.faults.skips_optimizer_step(step):
            self.optimizer.prepare_grads()  # main_grad -> the main params' .grad, as step() does before its norm
            grad_norm = self.optimizer.get_grad_norm()
        else:
            _, grad_norm, _ = self.optimizer.step()  # Megatron's norm is taken before it clips
        for _ in range(2 if ctx.faults.active("lr_scheduler_double_step", step) else 1):
            self.scheduler.step(increment=1)
        total = torch.stack(losses).sum() if losses and self._owner() else torch.zeros([])
        total = total.to(ctx.device)
        dist.all_reduce(total)
        if ctx.rank != 0:
            return None
        return StepOutput(loss=float(total), grad_norm=float(grad_norm), group_grad_norms=groups,
                          expert_load=expert_load, lr=lrs)

    def fingerprint_points(self) -> Any:
        """This rank's chunks under the canonical fingerprint names (engines/megatron/fingerprint.py)."""
        from megatron.core import parallel_state

        from parity.engines.megatron.fingerprint import megatron_points

        return megatron_points(self.model, self.ctx.scenario.layout.tp,
                               parallel_state.get_tensor_model_parallel_rank(), bool(self.config.sequence_parallel))

    def run_provenance(self) -> dict[str, Any]:
        """How the batch reached the model, read from what was built: THD or padded, the core-attention classes in
        the layers, the THD alignment, whether the MoE routers are told which tokens are padding."""
        layout = self.ctx.scenario.layout
        attention = sorted({type(m.core_attention).__qualname__ for chunk in self.model for m in chunk.modules()
                            if isinstance(getattr(m, "core_attention", None), torch.nn.Module)})
        path: dict[str, Any] = {"packing": self.ctx.scenario.workload.packing, "core_attention": attention}
        if self.packed:
            path |= {"qkv_format": "thd", "attention_mask": None, "thd_alignment": thd_alignment(layout.tp, layout.cp)}
        else:
            path |= {"qkv_format": "sbhd", "attention_mask": "[b, 1, s, s] causal and padding (True = masked)"}
        if self.arch.num_experts:
            path["padding_mask_to_routers"] = self.marks_padding
        return {"data_path": path, **({"cpu_stand_ins": self.cpu_stand_ins} if self.cpu_stand_ins else {})}

    @property
    def marks_padding(self) -> bool:
        """Whether the forward tells Megatron's MoE routers which tokens are padding (`padding_mask`, 0.15+), so
        that their load statistics (aux loss, expert bias) count real tokens only. Fault `moe_pad_tokens_routed`:
        it does not (as a caller that passes only tokens and positions, or 0.12, which has no such argument)."""
        return (bool(self.arch.num_experts) and not self.ctx.faults.active("moe_pad_tokens_routed")
                and accepts_padding_mask())

    def optimizer_steps(self) -> int | None:
        """The fewest steps any of Megatron's (chained) optimizers took, from the inner torch optimizers' state."""
        inner = getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]
        counts = [torch_optimizer_steps(opt.optimizer) for opt in inner if getattr(opt, "optimizer", None)]
        known = [c for c in counts if c is not None]
        return min(known) if known else None

    # ---- its checkpoint: Megatron's distributed checkpoint (dist-ckpt, torch_dist) ------------------------------
    def _sharded_state(self, loading: bool) -> dict[str, Any]:
        """What Megatron-LM's checkpointing (and verl's MegatronCheckpointManager) puts in a dist-ckpt: each model
        chunk's sharded state dict (`model`, or `model0`, `model1`, ... under VPP), the optimizer's sharded state
        built on it (Adam's moments, step counts, fp32 main params; the distributed optimizer's shards in a
        layout-free form, so tp2 -> pp2 reshards), the scheduler's state."""
        from megatron.core import parallel_state

        # a resume onto another layout (both its parts see `resume.layout`) saves the layout-free form
        resume = self.ctx.scenario.resume
        reshards = resume is not None and resume.layout is not None
        metadata = compat.dist_ckpt_metadata(self.ddp_config.use_distributed_optimizer, fully_reshardable=reshards)
        model_state: dict[str, Any] = {}
        for index, chunk in enumerate(self.model):
            if len(self.model) > 1:
                parallel_state.set_virtual_pipeline_model_parallel_rank(index)
            key = f"model{index}" if len(self.model) > 1 else "model"
            model_state[key] = chunk.module.sharded_state_dict(**compat.metadata_kwargs(chunk.module, metadata))
        optimizer = self.optimizer.sharded_state_dict(model_state, is_loading=loading,
                                                      **compat.metadata_kwargs(self.optimizer, metadata))
        return {**model_state, "optimizer": optimizer, "opt_param_scheduler": self.scheduler.state_dict()}

    def save_checkpoint(self, directory: Path) -> None:
        from megatron.core import dist_checkpointing

        (directory / DIST_CKPT_DIR).mkdir(exist_ok=True)
        dist_checkpointing.save(self._sharded_state(loading=False), str(directory / DIST_CKPT_DIR))

    @torch.no_grad()  # as torch's load_state_dict: the distributed optimizer's fp32 main params are views of the
    def load_checkpoint(self, directory: Path) -> None:  # params, which an in-place copy under autograd refuses
        """Into the model built by setup() on this run's layout: dist-ckpt reads each rank's share of the saved
        global tensors, whatever layout wrote them."""
        from megatron.core import dist_checkpointing

        if compat.allocate_optimizer_state(self.optimizer):
            self.cpu_stand_ins.append(compat.FRESH_OPTIMIZER_STATE)
        state = dist_checkpointing.load(self._sharded_state(loading=True), str(directory / DIST_CKPT_DIR))
        for index, chunk in enumerate(self.model):
            chunk.module.load_state_dict(state[f"model{index}" if len(self.model) > 1 else "model"])
        finish_resume(self.optimizer, state["optimizer"], self.scheduler, state["opt_param_scheduler"],
                      self.ctx.faults)

    @classmethod
    def convert_checkpoint(cls, directory: Path, hf_dir: Path, base: Path, faults: FaultPlan) -> None:
        from parity.engines.megatron.dist_ckpt import dist_ckpt_to_hf

        dist_ckpt_to_hf(directory / DIST_CKPT_DIR, hf_dir, base, faults)

    def teardown(self) -> None:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if self._shim is not None:
            self._shim.restore()
            self._shim = None
