"""Two ranks over the emulated HCCL group (tests/emulated_npu/site/torch_npu/_hccl.py), for
tests/multiproc/test_emulated_hccl.py. Run as a script with the site on PYTHONPATH (the emulation enters a
TorchFunctionMode process-wide at import, so the test process never imports it): `python hccl_probe.py OUT.json`.

Each case runs the same collective on the 'hccl' default group and on a plain gloo group of the same ranks, and
records (rank 0) 'ok' with both results, or the refusal's type and message. Every case is a pair: a planted input
the group must refuse and its clean twin."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

WORLD = 2


def _cases(rank: int) -> dict[str, Callable[[Any], Any]]:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    def all_reduce(dtype: torch.dtype, op: Any = dist.ReduceOp.SUM) -> Callable[[Any], Any]:
        def run(group: Any) -> Any:
            tensor = torch.tensor([rank + 1.5, 2.0, -3.0]).to(dtype)
            dist.all_reduce(tensor, op=op, group=group)
            return tensor.tolist()
        return run

    def all_gather(dtype: torch.dtype) -> Callable[[Any], Any]:
        def run(group: Any) -> Any:
            parts = [torch.empty(2, dtype=dtype) for _ in range(WORLD)]
            dist.all_gather(parts, torch.tensor([rank, rank + 0.25]).to(dtype), group=group)
            return [p.tolist() for p in parts]
        return run

    def reduce_scatter(dtype: torch.dtype) -> Callable[[Any], Any]:
        def run(group: Any) -> Any:
            out = torch.empty(2, dtype=dtype)
            dist.reduce_scatter_tensor(out, (torch.arange(4.0) + rank).to(dtype), group=group)
            return out.tolist()
        return run

    def functional(dtype: torch.dtype) -> Callable[[Any], Any]:
        def run(group: Any) -> Any:  # DTensor's path: the functional collectives resolve the group by name
            return funcol.all_reduce(torch.tensor([1.0 + rank]).to(dtype), "sum", group).tolist()
        return run

    def gather(group: Any) -> Any:
        parts = [torch.empty(1) for _ in range(WORLD)] if rank == 0 else None
        dist.gather(torch.tensor([float(rank)]), parts, dst=0, group=group)
        return None

    def objects(group: Any) -> Any:
        every: list[Any] = [None] * WORLD
        dist.all_gather_object(every, {"rank": rank}, group=group)
        return every

    return {
        "all_reduce/float64": all_reduce(torch.float64), "all_reduce/float32": all_reduce(torch.float32),
        "all_reduce/bfloat16": all_reduce(torch.bfloat16), "all_reduce/int64": all_reduce(torch.int64),
        "all_reduce/bool": all_reduce(torch.bool), "all_reduce/int8": all_reduce(torch.int8),
        "all_reduce/prod/bfloat16": all_reduce(torch.bfloat16, dist.ReduceOp.PRODUCT),
        "all_reduce/prod/int16": all_reduce(torch.int16, dist.ReduceOp.PRODUCT),
        "all_reduce/prod/float32": all_reduce(torch.float32, dist.ReduceOp.PRODUCT),
        "all_reduce/band/int32": all_reduce(torch.int32, dist.ReduceOp.BAND),
        "all_reduce/max/int32": all_reduce(torch.int32, dist.ReduceOp.MAX),
        "reduce_scatter/float64": reduce_scatter(torch.float64),
        "reduce_scatter/float32": reduce_scatter(torch.float32),
        "all_gather/float64": all_gather(torch.float64), "all_gather/uint16": all_gather(torch.uint16),
        "all_gather/uint8": all_gather(torch.uint8),
        "functional/float64": functional(torch.float64), "functional/float32": functional(torch.float32),
        "gather": gather, "all_gather_object": objects,
    }


def _rank(rank: int, store_path: str, queue: Any) -> None:
    import torch.distributed as dist
    import torch_npu  # noqa: F401 - registers the 'hccl' backend, as the real torch_npu does at import

    dist.init_process_group("hccl", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD)
    gloo = dist.new_group(list(range(WORLD)), backend="gloo")
    found: dict[str, Any] = {"backend": dist.get_backend()}
    for name, case in _cases(rank).items():
        try:
            hccl = case(dist.group.WORLD)
        except Exception as exc:  # the refusal is the result
            found[name] = {"refused": type(exc).__name__, "message": str(exc)}
            dist.barrier(group=gloo)  # the peer may have refused on another rank's input: resynchronise
            continue
        found[name] = {"hccl": hccl, "gloo": case(gloo)}
    queue.put((rank, found))
    dist.destroy_process_group()


def main(out: str) -> None:
    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as work:
        ranks = [context.Process(target=_rank, args=(r, f"{work}/store", queue)) for r in range(WORLD)]
        for process in ranks:
            process.start()
        found = dict(queue.get(timeout=120) for _ in ranks)
        for process in ranks:
            process.join(timeout=60)
    with open(out, "w") as handle:
        json.dump(found[0], handle)


if __name__ == "__main__":
    main(sys.argv[1])
