"""verl's single controller, run on every rank in-process: verl's own worker (`ActorRolloutRefWorker`, its actor
and ref roles, each holding verl's `TrainingWorker`) and verl's own trainer steps (`RayPPOTrainer._update_actor` /
`_compute_old_log_prob` / `_compute_ref_log_prob`, `compute_advantage`), with verl's dispatch and collect.

What stands in for verl (each fingerprinted in engines/verl/upstream.py, so a change upstream FAILs a test):
- verl's Ray worker group (`verl/single_controller/ray/base.py` RayWorkerGroup, and the Ray object store that
  `verl/single_controller/base/decorator.py` `dispatch_nd_compute` puts each chunk in): `LocalWorkerGroup` below
  splits the batch with verl's own `_split_args_kwargs_data_proto`, runs the worker's `register`ed method on this
  rank's chunk (every rank does the same, as Ray's execute_all would), and collects the collect ranks' outputs with
  verl's own `_concat_data_proto_or_future`, in global-rank order as `collect_nd_compute` does;
- the trainer object verl's `_update_actor` and friends are methods of (`RayPPOTrainer`, a Ray driver): they are
  called unbound on `TrainerView`, which holds the attributes they read (the config, the worker groups).
Nothing of verl's trainer or worker logic is copied here.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist


class LocalWorkerGroup:
    """One role's worker group as verl's single controller sees it, on this rank (module docstring)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self._maps: dict[str, tuple[list[int], list[bool]]] = {}

    def _mesh(self, mesh: str) -> tuple[list[int], list[bool]]:
        """verl's dispatch info (each global rank's dp rank) and collect info (which ranks hold outputs) of a
        mesh, gathered from every rank's worker as RayWorkerGroup._query_dispatch_info / _query_collect_info
        gather them from its actors."""
        if mesh not in self._maps:
            mine = (self.worker._query_dispatch_info(mesh), bool(self.worker._query_collect_info(mesh)))
            every: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
            self._maps[mesh] = ([d for d, _ in every], [c for _, c in every])
        return self._maps[mesh]

    def call(self, method: str, mesh: str, data: Any) -> Any:
        from verl.single_controller.base.decorator import _concat_data_proto_or_future, _split_args_kwargs_data_proto

        dp_ranks, collect = self._mesh(mesh)
        (chunks,), _ = _split_args_kwargs_data_proto(max(dp_ranks) + 1, data)
        # Ray hands the worker its chunk through the object store: a deserialized copy, not a view of the batch
        chunk = pickle.loads(pickle.dumps(chunks[dp_ranks[dist.get_rank()]]))
        output = getattr(self.worker, method)(chunk)
        outputs: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(outputs, output)
        return _concat_data_proto_or_future([o for o, kept in zip(outputs, collect, strict=True) if kept])

    # the register'ed methods verl's trainer calls on the actor / ref worker groups
    def update_actor(self, data: Any) -> Any:
        return self.call("update_actor", "actor", data)

    def compute_log_prob(self, data: Any) -> Any:
        return self.call("compute_log_prob", "actor", data)

    def compute_ref_log_prob(self, data: Any) -> Any:
        return self.call("compute_ref_log_prob", "ref", data)


@dataclass
class TrainerView:
    """The attributes of verl's RayPPOTrainer that its `_update_actor`, `_compute_old_log_prob` and
    `_compute_ref_log_prob` read (verl/trainer/ppo/ray_trainer.py)."""

    config: Any
    actor_rollout_wg: LocalWorkerGroup
    ref_policy_wg: LocalWorkerGroup | None = None
    ref_in_actor: bool = False
    distillation_config: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def update_actor(self, batch: Any) -> Any:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        return RayPPOTrainer._update_actor(self, batch)

    def compute_old_log_prob(self, batch: Any) -> Any:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        return RayPPOTrainer._compute_old_log_prob(self, batch)

    def compute_ref_log_prob(self, batch: Any) -> Any:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        return RayPPOTrainer._compute_ref_log_prob(self, batch)


def worker_environment() -> None:
    """verl's Worker reads its rank and world from the environment Ray (or torchrun) sets; the harness's forked
    ranks hold an initialised process group instead, whose rank and size are the same facts."""
    os.environ.setdefault("RANK", str(dist.get_rank()))
    os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "0")


def build_worker(config: Any, role: str) -> Any:
    """verl's ActorRolloutRefWorker for `role` ('actor' or 'ref'), its model built (init_model, ONE_TO_ALL)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    worker_environment()
    worker = ActorRolloutRefWorker(config=config, role=role)
    worker.init_model()
    return worker
