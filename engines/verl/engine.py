"""verl's own training engines as candidates: the engine object verl builds (`EngineRegistry.new` + `initialize()`)
from verl's own config dataclasses, driven only through verl's public engine API (`eval_mode` / `infer_batch`,
`train_mode` / `train_batch`, `lr_scheduler_step`), with verl's own actor loss (`ppo_loss`).

The harness plays the part of verl's trainer and worker around the engine, doing what they do and no more
(verl 0.9.1): the batch goes from verl's left/right-padded layout to its no-padding format with verl's
`left_right_2_no_padding` (verl/trainer/ppo/ray_trainer.py `_update_actor`); the trainer's meta keys are set as
`_update_actor` / `_compute_old_log_prob` set them; the engine-config fields the worker copies from the actor config
are copied as `verl/workers/engine_workers.py` (ActorRolloutRefWorker.init_model) copies them; the per-call keys
come from the engine config as `TrainingWorker.train_batch` / `infer_batch` inject them; the step's loss is the sum
over micro-batches averaged over data parallel, as `TrainingWorker._postprocess_output` reports it. Results go to
rank 0 in the harness's [B, R] layout via verl's `no_padding_2_padding`.

Subclasses name the verl backend (its config, engine device and key table) and its read-backs.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from parity.engines.verl import keys as verl_keys
from parity.engines.verl import shims, source
from parity.engines.verl.keys import BLOCK, EngineKeys
from parity.harness.contract.engine import Engine, StepOutput, TokenOutputs
from parity.harness.contract.optim_state import zero_adam_moments
from parity.harness.contract.workload import Batch

#: where verl's checkpoint manager writes inside a checkpoint directory
VERL_DIR = "verl"


class VerlEngine(Engine):
    config_name: ClassVar[str]
    """verl's trainer config the engine's defaults come from (verl/trainer/config/<name>.yaml)."""
    engine_device: ClassVar[str] = "cuda"
    """The device verl's engine registry looks up (VERL_ENGINE_DEVICE on CPU)."""
    keys: ClassVar[EngineKeys]

    # ---- setup -----------------------------------------------------------------------------------------------
    def setup(self) -> None:
        from parity.engines.verl import config, observe

        source.activate()
        device = self.ctx.scenario.device
        self.shims = shims.select_platform(device, self.engine_device)
        if problem := source.problem():
            raise RuntimeError(problem)
        if problem := shims.platform_problem(device):
            raise RuntimeError(problem)
        self.shims += shims.apply(device)
        self.shims += self.backend_shims()
        self.configs = config.build(self.config_name, self.ctx.scenario.actor_rollout_ref, self.ctx.checkpoint)
        actor = self.configs.actor
        self.engine_config = actor.engine
        self.configure_engine(actor, self.configs.model)
        observe.watch_builds()
        self.before_build()
        from verl.workers.engine import EngineRegistry

        self.engine = EngineRegistry.new(model_type="language_model", backend=self.engine_config.strategy,
                                         model_config=self.configs.model, engine_config=self.engine_config,
                                         optimizer_config=actor.optim, checkpoint_config=actor.checkpoint)
        self.engine.initialize()
        self.observed = observe.observe(self.engine, self.observed_module(), self.engine.optimizer)
        self.lrs_after_step: list[float] = []

    def configure_engine(self, actor: Any, model: Any) -> None:
        """The engine-config fields verl's worker copies from the actor and model configs before it builds the
        engine (verl/workers/engine_workers.py, ActorRolloutRefWorker.init_model and TrainingWorker.__init__).
        Inference uses the actor's micro-batching (the worker would take the rollout section's log_prob_* keys,
        which are not under test)."""
        engine = self.engine_config
        engine.use_dynamic_bsz = actor.use_dynamic_bsz
        engine.max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu
        engine.micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu
        engine.infer_max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu
        engine.infer_micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu
        engine.use_remove_padding = model.get("use_remove_padding", False)
        engine.use_fused_kernels = model.get("use_fused_kernels", False)
        # verl's trainer writes the run's length into the optimizer config (verl/trainer/ppo/ray_trainer.py
        # _create_dataloader): the schedulers decay over it and derive a warmup ratio's steps from it
        actor.optim.total_training_steps = self.ctx.scenario.workload.steps

    def before_build(self) -> None:
        """Runs after verl is imported and configured, before its EngineRegistry builds the engine."""

    def backend_shims(self) -> list[str]:
        """The backend's own device shims (engines/verl/shims.py), applied once verl is imported and before verl
        builds its engine; returns their names for the record."""
        return []

    def observed_module(self) -> torch.nn.Module:
        """The module whose forward inputs are recorded (the built HF / Megatron model)."""
        return self.engine.module

    def built_backend(self) -> str:
        """verl's name for the backend it built (the `actor.strategy` read back)."""
        raise NotImplementedError

    def hf_model(self) -> Any:
        """The built transformers model, unwrapped (for the model.* read-backs)."""
        raise NotImplementedError

    def sequence_parallel_size(self) -> int:
        """Ranks one sequence is split over (verl's token budget is per rank times this)."""
        return 1

    # ---- the data verl's trainer hands the worker -------------------------------------------------------------
    def _tensordict(self, batch: Batch, extra: dict[str, torch.Tensor], meta: dict[str, Any]) -> Any:
        """This data-parallel rank's rows in verl's no-padding format, with the meta keys the trainer and the
        worker set."""
        from tensordict import TensorDict
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        dp, rank = self.engine.get_data_parallel_size(), self.engine.get_data_parallel_rank()
        rows = batch.input_ids.shape[0] // dp
        local = slice(rank * rows, (rank + 1) * rows)
        prompt = batch.prompt_len
        tensors = {"input_ids": batch.input_ids[local], "attention_mask": batch.attention_mask[local],
                   "position_ids": batch.position_ids[local], "response_mask": batch.response_mask[local],
                   "prompts": batch.input_ids[local, :prompt], "responses": batch.input_ids[local, prompt:],
                   **{k: v[local] for k, v in extra.items()}}
        data = left_right_2_no_padding(TensorDict(tensors, batch_size=[rows]))
        engine = self.engine_config
        tu.assign_non_tensor(data, temperature=1.0, use_remove_padding=engine.use_remove_padding,
                             use_dynamic_bsz=engine.use_dynamic_bsz, use_fused_kernels=engine.use_fused_kernels,
                             **meta)
        return data

    def _responses(self, out: Any, data: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """[rows, R] log-probs and entropy from an engine output, on ranks that hold outputs."""
        from verl.workers.utils.padding import no_padding_2_padding

        if out is None or not self.engine.is_mp_src_rank_with_outputs():
            return None
        model_output = out["model_output"]
        return (no_padding_2_padding(model_output["log_probs"], data).float().cpu(),
                no_padding_2_padding(model_output["entropy"], data).float().cpu())

    def _gather_rows(self, piece: tuple[torch.Tensor, torch.Tensor] | None) -> list[torch.Tensor] | None:
        """Every data-parallel rank's rows on rank 0, in data-parallel order."""
        pieces: list[Any] = [None] * self.ctx.world_size
        mine = None if piece is None else (self.engine.get_data_parallel_rank(), piece)
        dist.all_gather_object(pieces, mine)
        if self.ctx.rank != 0:
            return None
        by_rank: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for item in pieces:
            if item is not None:
                by_rank.setdefault(item[0], item[1])
        ordered = [by_rank[r] for r in sorted(by_rank)]
        return [torch.cat([p[i] for p in ordered], dim=0) for i in range(2)]

    # ---- the contract ---------------------------------------------------------------------------------------
    def forward(self, batch: Batch) -> TokenOutputs | None:
        # verl/trainer/ppo/ray_trainer.py _compute_old_log_prob: entropy on, no loss
        data = self._tensordict(batch, {}, {"calculate_entropy": True, "compute_loss": False,
                                            "max_token_len_per_gpu": self.engine_config.infer_max_token_len_per_gpu,
                                            "micro_batch_size_per_gpu":
                                                self.engine_config.infer_micro_batch_size_per_gpu})
        self.observed.phase = "infer"
        with self.engine.eval_mode():
            out = self.engine.infer_batch(data, loss_function=None)
        whole = self._gather_rows(self._responses(out, data))
        return None if whole is None else TokenOutputs(logprobs=whole[0], entropy=whole[1])

    def loss_function(self) -> Any:
        """verl's actor loss, bound to the actor config as verl's worker binds it (engine_workers.py)."""
        from verl.workers.utils.losses import ppo_loss

        return functools.partial(ppo_loss, config=self.configs.actor)

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput | None:
        actor = self.configs.actor
        # verl/trainer/ppo/ray_trainer.py _update_actor: the meta keys of an actor update
        meta = {"calculate_entropy": bool(actor.calculate_entropy or actor.entropy_coeff != 0.0),
                "global_batch_size": actor.ppo_mini_batch_size * actor.rollout_n, "compute_loss": True,
                "max_token_len_per_gpu": self.engine_config.max_token_len_per_gpu,
                "micro_batch_size_per_gpu": self.engine_config.micro_batch_size_per_gpu}
        data = self._tensordict(batch, {"old_log_probs": old_logprobs.float(), "advantages": batch.advantages.float()},
                                meta)
        self.observed.phase = "train"
        self.observed.rows_per_train_batch.append(len(data))
        loss_function = self.loss_function()
        self.observed.loss_configs.append(getattr(loss_function, "keywords", {}).get("config"))
        with self.engine.train_mode():
            out = self.engine.train_batch(data, loss_function=loss_function)
        self.lrs_after_step.append(self.engine.lr_scheduler_step())
        return self._step_result(out)

    def _step_result(self, out: Any) -> StepOutput | None:
        """Loss and pre-clip grad norm as verl's TrainingWorker reports them (sum over micro-batches, averaged over
        data parallel), from a rank holding outputs, on rank 0."""
        result = None
        if self.engine.is_mp_src_rank_with_outputs():
            losses = out["loss"]
            total = torch.tensor(float(sum(losses)), dtype=torch.float64)
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.engine.get_data_parallel_group())
            loss = float(total) / self.engine.get_data_parallel_size()
            grad_norm = out["metrics"]["grad_norm"]
            result = (loss, float(grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm))
        results: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(results, result)
        if self.ctx.rank != 0:
            return None
        loss, grad_norm = next(r for r in results if r is not None)
        # the lr every param group ran at, as observed at this step's optimizer.step() (observe.py)
        lrs = [float(group["lr"]) for group in self.observed.optimizer_groups[-1]] \
            if self.observed.optimizer_groups else None
        return StepOutput(loss=loss, grad_norm=grad_norm, lr=lrs)

    # ---- its checkpoint: verl's own, through the engine API as verl's worker calls it -----------------------------
    def save_checkpoint(self, directory: Path) -> None:
        """verl/workers/engine_workers.py save_checkpoint: the backend's checkpoint manager writes model, optimizer,
        lr scheduler and RNG states."""
        steps = len(self.observed.optimizer_groups)
        self.engine.save_checkpoint(local_path=str(directory / VERL_DIR), global_step=steps)

    def load_checkpoint(self, directory: Path) -> None:
        self.before_load()
        self.engine.load_checkpoint(local_path=str(directory / VERL_DIR), del_local_after_load=False)
        if self.ctx.faults.active("resume_adam_moments_zeroed"):
            zero_adam_moments(self.engine.optimizer)

    def before_load(self) -> None:
        """Runs in the fresh processes before verl's engine loads its checkpoint (a backend's device shims)."""

    # ---- read-back --------------------------------------------------------------------------------------------
    def applied_kwargs(self) -> dict[str, Any]:
        """Each verl key given, with what verl did with it: its read-back where the key table names one; a key at
        verl's own default otherwise reports the value verl's config holds (a drop could not change anything)."""
        from parity.engines.verl.readback import NOT_READ, read_back

        given = self.ctx.scenario.actor_rollout_ref
        applied = {}
        for key, requested in given.items():
            value = read_back(self, key, requested)
            if value is not NOT_READ:
                applied[key] = value
        return {BLOCK: applied} if applied else {}

    def run_provenance(self) -> dict[str, Any]:
        return {"verl": {**source.provenance(), "engine_class": type(self.engine).__module__ + "." +
                         type(self.engine).__qualname__, "shims": self.shims,
                         "defaults_taken": sorted(k for k, v in self.ctx.scenario.actor_rollout_ref.items()
                                                  if verl_keys.same_value(v, self.configs.defaults.get(k)))}}

    def optimizer_steps(self) -> int | None:
        from parity.harness.contract.optim_state import torch_optimizer_steps

        return torch_optimizer_steps(self.engine.optimizer)
