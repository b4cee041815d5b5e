"""verl's own training engines as candidates, driven as verl drives them: verl's worker (`ActorRolloutRefWorker`,
its actor role holding verl's `TrainingWorker`, and its ref role for a KL loss) runs on every rank in-process, built
from verl's own config tree (`init_model`), and verl's trainer steps run around it: `_compute_old_log_prob`,
`_compute_ref_log_prob`, `compute_advantage`, `_update_actor` (verl/trainer/ppo/ray_trainer.py), which call the
worker's `register`ed methods `compute_log_prob` / `compute_ref_log_prob` / `update_actor`. The worker binds verl's
actor loss (`ppo_loss`) to the actor config, copies the engine-config fields from the actor and rollout sections,
splits the step's batch into mini-batches (`train_mini_batch`: `global_token_num`, the scheduler stepped on the last
mini-batch), and reduces the loss and metrics. engines/verl/controller.py runs verl's single controller per rank;
what stands in for verl there is fingerprinted (engines/verl/upstream.py).

The harness hands verl what verl's rollout would: the batch as a `DataProto` (left-padded prompts, right-padded
responses), each response's outcome reward on its last real token (`token_level_rewards`, as verl's reward manager
places it) with group ids (`uid`) for an adv_estimator row, or the workload's fixed advantages otherwise.

Subclasses name the verl backend (its config, engine device and key table) and its read-backs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, ClassVar

import torch

from parity.engines.verl import keys as verl_keys
from parity.engines.verl import shims, source
from parity.engines.verl.keys import BLOCK, EngineKeys
from parity.harness.contract.engine import Engine, StepOutput, TokenOutputs
from parity.harness.contract.optim_state import zero_adam_moments
from parity.harness.contract.schema import RL_STEP_FIELDS, Workload
from parity.harness.contract.workload import Batch

#: where verl's checkpoint manager writes inside a checkpoint directory
VERL_DIR = "verl"


def rl_step_row(workload: Workload) -> bool:
    """Whether a row runs verl's RL step (any of its fields away from the default): its old log-probs are then the
    step's own (verl's compute_log_prob with the step's starting weights), as the reference computes them; a classic
    row trains every step against the first forward's log-probs (the harness's rollout)."""
    return any(getattr(workload, name) != type(workload).model_fields[name].default for name in RL_STEP_FIELDS)


class VerlEngine(Engine):
    config_name: ClassVar[str]
    """verl's trainer config the engine's defaults come from (verl/trainer/config/<name>.yaml)."""
    engine_device: ClassVar[str] = "cuda"
    """The device verl's engine registry looks up (VERL_ENGINE_DEVICE on CPU)."""
    keys: ClassVar[EngineKeys]

    # ---- setup -----------------------------------------------------------------------------------------------
    def setup(self) -> None:
        from parity.engines.verl import config, controller, observe

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
        self.tree = self.trainer_config(self.configs.tree)
        observe.watch_builds()
        self.observed = observe.Observations()
        observe.watch_worker(self.observed)
        self.before_build()
        workload = self.ctx.scenario.workload
        self.ref_worker = controller.build_worker(self.tree[BLOCK], "ref") if workload.use_kl_loss else None
        self.worker = controller.build_worker(self.tree[BLOCK], "actor")
        self.engine = self.worker.actor.engine
        self.engine_config = self.worker.actor.engine_config
        self.trainer = controller.TrainerView(
            config=self.tree, actor_rollout_wg=controller.LocalWorkerGroup(self.worker),
            ref_policy_wg=controller.LocalWorkerGroup(self.ref_worker) if self.ref_worker is not None else None)
        observe.observe(self.observed, self.engine, self.observed_module(), self.engine.optimizer)

    def trainer_config(self, tree: Any) -> Any:
        """verl's whole trainer config as verl's trainer hands it to the worker: what verl's trainer writes into it
        (the run's length: ray_trainer.py _create_dataloader writes total_training_steps), the RL step's settings
        outside the actor section from the workload (algorithm.adv_estimator, rollout.n), and the rollout
        section's log-prob micro-batching as the actor's (the rollout is not under test: verl's worker asserts
        the two agree on use_dynamic_bsz and takes its inference micro-batches from there), and no balance_batch."""
        from omegaconf import OmegaConf, open_dict

        workload = self.ctx.scenario.workload
        OmegaConf.set_struct(tree, False)
        block = tree[BLOCK]
        with open_dict(tree):
            block.actor.optim.total_training_steps = workload.steps
            block.rollout.n = workload.group_size or 1
            block.rollout.log_prob_use_dynamic_bsz = block.actor.use_dynamic_bsz
            block.rollout.log_prob_micro_batch_size_per_gpu = block.actor.ppo_micro_batch_size_per_gpu
            block.rollout.log_prob_max_token_len_per_gpu = block.actor.ppo_max_token_len_per_gpu
            if workload.adv_estimator is not None:
                tree.algorithm.adv_estimator = workload.adv_estimator
            # the contract's mini-batches are the batch's rows in order; verl's fit reorders rows across data
            # parallel ranks only with balance_batch (ray_trainer.py _balance_batch), which this driver never calls
            tree.trainer.balance_batch = False
        return tree

    def before_build(self) -> None:
        """Runs after verl is imported and configured, before verl's worker builds the engine."""

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

    def role_view(self, role: str) -> VerlEngine | str:
        """This engine as seen from one of verl's workers: the actor (itself), or the ref worker's engine in its
        place, so that a read-back rule reads the objects verl built for that role; why not where verl built none."""
        if role == "actor":
            return self
        if role != "ref" or self.ref_worker is None:
            return f"verl built no {role} worker (workload.use_kl_loss is off)"
        view = copy.copy(self)
        view.engine = self.ref_worker.ref.engine
        return view

    @property
    def actor_config(self) -> Any:
        """The actor config verl's worker built and bound its loss to (ActorRolloutRefWorker.init_model)."""
        return self.worker.loss_fn.keywords["config"]

    # ---- the batch verl's rollout hands its trainer -----------------------------------------------------------
    def _data(self, batch: Batch, extra: dict[str, torch.Tensor] | None = None) -> Any:
        """The whole batch as verl's trainer holds it after a rollout (a DataProto: left-padded prompts,
        right-padded responses, the response mask), the same on every rank."""
        import numpy as np
        from verl import DataProto

        prompt = batch.prompt_len
        tensors = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                   "position_ids": batch.position_ids, "response_mask": batch.response_mask,
                   "prompts": batch.input_ids[:, :prompt], "responses": batch.input_ids[:, prompt:], **(extra or {})}
        group = self.ctx.scenario.workload.group_size or 1
        uid = np.array([f"prompt-{row // group}" for row in range(batch.input_ids.shape[0])], dtype=object)
        # ray_trainer.py fit: the step's batch carries the rollout temperature, one uid per prompt shared by its
        # rollout.n responses (gen_batch.repeat(interleave=True): a group's rows are consecutive), and its tokens
        # per row (global_token_num, for verl's mfu metrics). trainer.balance_batch is off (trainer_config)
        meta = {"temperature": self.tree[BLOCK].rollout.temperature, "images_seqlens": [],
                "global_token_num": batch.attention_mask.sum(dim=-1).tolist()}
        return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid}, meta_info=meta)

    @staticmethod
    def outcome_rewards(batch: Batch) -> torch.Tensor:
        """[B, R] token-level rewards: each response's reward on its last real token, where verl's reward manager
        puts an outcome reward (verl/workers/reward_manager/naive.py: valid_response_length - 1)."""
        assert batch.rewards is not None
        scores = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        last = batch.response_mask.sum(dim=1).long() - 1
        scores[torch.arange(scores.shape[0]), last] = batch.rewards.float()
        return scores

    # ---- the contract ---------------------------------------------------------------------------------------
    def forward(self, batch: Batch) -> TokenOutputs | None:
        """verl's trainer's _compute_old_log_prob: the actor worker's compute_log_prob, entropy on."""
        self.observed.phase = "infer"
        old, _mfu = self.trainer.compute_old_log_prob(self._data(batch))
        self.observed.record_resting(self.engine.module, self.engine.optimizer)
        if self.ctx.rank != 0:
            return None
        return TokenOutputs(logprobs=old.batch["old_log_probs"].float().cpu(),
                            entropy=old.batch["entropys"].float().cpu())

    def train_step(self, batch: Batch, old_logprobs: torch.Tensor, step: int) -> StepOutput | None:
        """One step of verl's trainer (ray_trainer.py fit): the step's old log-probs (an RL-step row; a classic
        row's are the harness's rollout's), the reference policy's log-probs (KL loss), the advantages
        (compute_advantage from the rewards, or the workload's), then update_actor: verl's worker splits the
        batch into mini-batches and epochs and steps the scheduler after the last."""
        from verl.trainer.ppo.ray_trainer import compute_advantage

        workload = self.ctx.scenario.workload
        data = self._data(batch)
        self.observed.phase = "infer"
        if rl_step_row(workload):
            old, _mfu = self.trainer.compute_old_log_prob(data)
            data = data.union(old)
        else:
            data.batch["old_log_probs"] = old_logprobs.float()
        if self.ref_worker is not None:
            data = data.union(self.trainer.compute_ref_log_prob(data))
        if workload.adv_estimator is not None:
            # ray_trainer.py fit: token_level_rewards are the scores (algorithm.use_kl_in_reward off)
            data.batch["token_level_scores"] = self.outcome_rewards(batch)
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
            algorithm = self.tree.algorithm
            data = compute_advantage(data, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma,
                                     lam=algorithm.lam, num_repeat=self.tree[BLOCK].rollout.n,
                                     norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, config=algorithm)
            self.observed.advantages.append(data.batch["advantages"].float().cpu())
        else:
            data.batch["advantages"] = batch.advantages.float()
        self.observed.phase = "train"
        out = self.trainer.update_actor(data)
        self.observed.record_resting(self.engine.module, self.engine.optimizer)
        return self._step_result(out.meta_info["metrics"], workload)

    def _step_result(self, metrics: dict[str, Any], workload: Workload) -> StepOutput | None:
        """Each optimizer update's loss and pre-clip grad norm as verl's worker reduced them (train_mini_batch:
        one entry per mini-batch and epoch, the loss summed over micro-batches and averaged over data parallel)."""
        if self.ctx.rank != 0:
            return None
        losses, grad_norms = list(metrics["actor/loss"]), list(metrics["actor/grad_norm"])
        updates = [(float(loss), float(norm)) for loss, norm in zip(losses, grad_norms, strict=True)]
        # the lr every param group ran at, as observed at this step's last optimizer.step() (observe.py)
        lrs = [float(group["lr"]) for group in self.observed.optimizer_groups[-1]] \
            if self.observed.optimizer_groups else None
        loss, grad_norm = updates[-1]
        return StepOutput(loss=loss, grad_norm=grad_norm, lr=lrs,
                          updates=updates if workload.updates_per_step > 1 else None)

    def teardown(self) -> None:
        from parity.engines.verl import observe

        observe.unwatch_worker()

    # ---- its checkpoint: verl's own, through verl's worker (its register'ed save / load, ONE_TO_ALL) -------------
    def save_checkpoint(self, directory: Path) -> None:
        """verl/workers/engine_workers.py save_checkpoint: the backend's checkpoint manager writes model, optimizer,
        lr scheduler and RNG states."""
        steps = len(self.observed.optimizer_groups)
        self.worker.save_checkpoint(local_path=str(directory / VERL_DIR), global_step=steps)

    def load_checkpoint(self, directory: Path) -> None:
        self.before_load()
        self.worker.load_checkpoint(local_path=str(directory / VERL_DIR), del_local_after_load=False)
        if self.ctx.faults.active("resume_adam_moments_zeroed"):
            zero_adam_moments(self.engine.optimizer)

    def before_load(self) -> None:
        """Runs in the fresh processes before verl's engine loads its checkpoint (a backend's device shims)."""

    # ---- read-back --------------------------------------------------------------------------------------------
    def applied_kwargs(self) -> dict[str, Any]:
        """Each verl key given, with what verl did with it: its read-back where the key table names one; a key at
        verl's own default otherwise reports the value verl's config holds (a drop could not change anything)."""
        from parity.engines.verl import observe
        from parity.engines.verl.readback import NOT_READ, read_back

        # what verl's loss did on any rank (a pipeline calls it on its last stage only), read on every rank
        fields = {key.rsplit(".", 1)[-1] for key, rule in self.keys.read_back.items() if rule.rule == "loss_config"}
        observe.gather_loss_calls(self.observed, fields)
        given = self.ctx.scenario.actor_rollout_ref
        applied = {}
        for key, requested in given.items():
            value = read_back(self, key, requested)
            if value is not NOT_READ:
                applied[key] = value
        return {BLOCK: applied} if applied else {}

    def run_provenance(self) -> dict[str, Any]:
        return {"verl": {**source.provenance(), "engine_class": type(self.engine).__module__ + "." +
                         type(self.engine).__qualname__, "worker_class": type(self.worker).__module__ + "." +
                         type(self.worker).__qualname__, "shims": self.shims,
                         "defaults_taken": sorted(k for k, v in self.ctx.scenario.actor_rollout_ref.items()
                                                  if verl_keys.same_value(v, self.configs.defaults.get(k)))}}

    def optimizer_steps(self) -> int | None:
        from parity.harness.contract.optim_state import torch_optimizer_steps

        return torch_optimizer_steps(self.engine.optimizer)
