"""A planted float64 collective in an engine, for tests/multiproc/test_emulated_hccl.py: the fsdp2 engine whose
gradient-norm pieces are all-REDUCED in float64 — what engines/fsdp2/tensor_parallel.py `global_squares` did before
it gathered them — on a `device: npu` row over the emulated HCCL group. HCCL on Atlas A2/A3 reduces no float64, so
the row must ERROR naming the refused collective; on gloo (`device: cpu`) the same engine runs and PASSes."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from parity.engines.fsdp2 import tensor_parallel
from parity.engines.fsdp2.engine import FSDP2Engine


def float64_all_reduced_squares(grads: list[torch.Tensor]) -> list[float]:
    """Each gradient's squared norm over its mesh, the pieces all-reduced in float64 (the code before the fix)."""
    values: list[torch.Tensor] = []
    pending: dict[tuple[object, tuple[int, ...]], list[int]] = {}
    for grad in grads:
        values.append(torch.linalg.vector_norm(tensor_parallel.local(grad), 2.0, dtype=torch.float32).double() ** 2)
        placements = getattr(grad, "placements", None) or ()
        if sharded := tuple(dim for dim, p in enumerate(placements) if not p.is_replicate()):
            pending.setdefault((grad.device_mesh, sharded), []).append(len(values) - 1)
    for (mesh, dims), indices in pending.items():
        stacked = torch.stack([values[i] for i in indices])
        for dim in dims:
            dist.all_reduce(stacked, group=mesh.get_group(dim))  # type: ignore[attr-defined]
        for i, value in zip(indices, stacked.unbind(), strict=True):
            values[i] = value
    return [float(v) for v in values]


class Float64NormFSDP2Engine(FSDP2Engine):
    """fsdp2 with its pre-clip gradient norm taken by `float64_all_reduced_squares` (dp only: no TP replicas)."""

    def clip_grads(self, max_norm: float) -> float:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        total = math.sqrt(sum(float64_all_reduced_squares(grads)))
        super().clip_grads(max_norm)
        return total
