"""Upstream defects of the verl that runs here (the installed release, or PARITY_VERL_SRC's tree) that a row would
hit (the verl engines' `upstream_defects`): such a row is broken on this stack, naming the file, and
tests/multiproc/test_verl_defects.py lifts the mark to check it still FAILs there.

Each rule runs verl's own code on the row's data, so it follows verl's code rather than a version number: a
release that fixes the function no longer marks the row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from parity.engines.verl import source
from parity.harness.contract.parallel_dims import ParallelDims
from parity.harness.contract.schema import Scenario

PARTITION = "verl/utils/seqlen_balancing.py rearrange_micro_batches"


def worker_mini_batches(scenario: Scenario, lengths: list[int]) -> list[list[tuple[int, ...]]]:
    """Per data-parallel rank, the token lengths of each mini-batch verl's worker trains on: the single controller
    hands rank r the r-th of dp equal consecutive chunks (verl/protocol.py DataProto.chunk, dispatch_nd_compute),
    and train_mini_batch cuts its chunk into `mini_batches` consecutive mini-batches (make_iterator, shuffle off:
    the rows' order is what engines/verl/engine.py feeds)."""
    dp = ParallelDims.of(scenario.layout).dp
    chunk = len(lengths) // dp
    size = chunk // scenario.workload.mini_batches
    return [[tuple(lengths[r * chunk + i * size: r * chunk + (i + 1) * size])
             for i in range(scenario.workload.mini_batches)] for r in range(dp)]


def _partition(lengths: tuple[int, ...], max_token_len: int, min_count: int | None,
               divided_by: int | None) -> list[int]:
    """The tokens of each micro-batch verl's own partition forms from these lengths (no process group: the caller
    passes the count the data-parallel ranks agreed on as `min_count`)."""
    source.activate()
    from verl.utils import seqlen_balancing

    return list(_partitioned(seqlen_balancing.rearrange_micro_batches, lengths, max_token_len, min_count, divided_by))


@functools.cache
def _partitioned(partition: Callable[..., Any], lengths: tuple[int, ...], max_token_len: int, min_count: int | None,
                 divided_by: int | None) -> tuple[int, ...]:
    """Once per function and data: validation asks for each row more than once."""
    import torch
    from tensordict import TensorDict

    ids = torch.nested.as_nested_tensor([torch.zeros(n, dtype=torch.long) for n in lengths], layout=torch.jagged)
    _, parts = partition(TensorDict({"input_ids": ids}, batch_size=[len(lengths)]), max_token_len,
                         num_batches_divided_by=divided_by, min_num_micro_batch=min_count)
    return tuple(sum(lengths[i] for i in part) for part in parts)


def token_budget_partition(scenario: Scenario, shape: Any) -> str | None:
    """A `use_dynamic_bsz` row whose training micro-batches verl's balanced partition fills past the token budget
    (ppo_max_token_len_per_gpu x the sequence-parallel size, verl/workers/engine/utils.py prepare_micro_batches) on
    this row's data: verl's own partition run on the mini-batches its worker forms, its micro-batch count agreed
    over the data-parallel ranks (the largest one's, as verl's all_reduce MAX makes it). The budget read-back
    (engines/verl/readback.py micro_batches) FAILs such a row."""
    flat: dict[str, Any] = scenario.actor_rollout_ref
    budget = flat.get("actor.ppo_max_token_len_per_gpu")
    if (not flat.get("actor.use_dynamic_bsz") or budget is None or shape is None
            or source.problem() is not None):
        return None
    from parity.harness.contract.workload import build_batch

    dims = ParallelDims.of(scenario.layout)
    # the ranks one sequence is split over (verl's sp_size): Ulysses on its FSDP engine, context parallel on its
    # Megatron engine; each engine's layout has only its own, the other is 1
    max_token_len = int(budget) * dims.ulysses * dims.cp
    # verl's Megatron engine makes the count a multiple of microbatch_group_size_per_vp_stage (Megatron's default:
    # the pipeline size) under virtual pipelining (verl/workers/engine/megatron/transformer_impl.py)
    divided_by = dims.pp if dims.vpp > 1 else None
    batch = build_batch(scenario.workload, shape.vocab_size)
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1)]
    per_rank = worker_mini_batches(scenario, lengths)
    for index in range(scenario.workload.mini_batches):
        mini = [rank[index] for rank in per_rank]
        agreed = max(len(_partition(m, max_token_len, None, divided_by)) for m in mini)
        for rank, rank_lengths in enumerate(mini):
            tokens = _partition(rank_lengths, max_token_len, agreed, divided_by)
            if max(tokens) > max_token_len:
                return (f"verl's balanced partition ({PARTITION}) puts {max(tokens)} tokens in one of the "
                        f"{len(tokens)} micro-batches it makes of rank {rank}'s mini-batch {index + 1} "
                        f"({sum(rank_lengths)} tokens in {len(rank_lengths)} sequences) under a budget of "
                        f"{max_token_len}, the max_token_len its docstring makes the most a micro-batch holds "
                        f"(verl {source.version()} at {source.package_dir()})")
    return None
