"""A layout's parallel degrees and every rule that relates them to the batch, the sequence and the model, in one
place (shaped like torchtitan's distributed/parallel_dims.py ParallelDims: the degrees, validation whose message
names every factor, and the device mesh an engine builds from them). Torch-free at import: validation calls it
before any process starts, and only `build_mesh` (in a rank) imports torch; a family's own rules
(EngineSpec.rules: engines/megatron/rules.py, engines/fsdp2/rules.py, engines/verl/rules.py) add what only its
engines require."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Problem = tuple[str, str]
"""(the scenario key to fix, the message)."""


@dataclass(frozen=True, slots=True)
class ParallelDims:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    ulysses: int = 1
    sequence_parallel: bool = False

    @classmethod
    def of(cls, layout: Any) -> ParallelDims:
        return cls(dp=layout.dp, tp=layout.tp, pp=layout.pp, vpp=layout.vpp, cp=layout.cp, ep=layout.ep,
                   etp=layout.etp, ulysses=layout.ulysses, sequence_parallel=layout.sequence_parallel)

    @property
    def world_size(self) -> int:
        """The ranks the degrees span (expert and virtual-pipeline degrees subdivide them)."""
        return self.dp * self.tp * self.pp * self.cp * self.ulysses

    def build_mesh(self, device_type: str, names: tuple[str, ...]) -> Any:
        """A torch DeviceMesh over the named degrees, outermost first, each dimension named as here (torchtitan's
        build_mesh): an engine slices its process groups from it (mesh["tp"].get_group()) instead of carving
        ranks by hand. Every rank calls it, in the same order (it creates process groups)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, tuple(getattr(self, name) for name in names), mesh_dim_names=names)

    def batch_problems(self, batch_size: int) -> list[Problem]:
        if batch_size % self.dp:
            return [("workload.batch_size", f"batch_size({batch_size}) is not divisible by dp({self.dp})")]
        return []

    def sequence_problems(self, seq_len: int, packed: bool) -> list[Problem]:
        """Padded rows of seq_len tokens split over the sequence dimensions; packed rows have no fixed length (each
        engine pads its stream or sequences to what its split needs)."""
        if packed:
            return []
        problems = []
        if seq_len % self.ulysses:
            problems.append(("workload", f"sequence length {seq_len} (prompt_len + response_len) is not divisible "
                                         f"by ulysses({self.ulysses})"))
        if self.cp > 1 and seq_len % (2 * self.cp):
            problems.append(("layout.cp", f"sequence length {seq_len} is not divisible by 2*cp({2 * self.cp}) "
                                          "(load-balanced context parallel splits it into 2*cp chunks)"))
        if self.sequence_parallel and (seq_len // self.cp) % self.tp:
            problems.append(("workload", f"sequence parallel splits each rank's {seq_len // self.cp} tokens over "
                                         f"tp({self.tp}): they must divide evenly"))
        return problems

    def model_problems(self, shape: Any, model: str) -> list[Problem]:
        """Heads over tp and ulysses, layers over pp x vpp, experts over ep (`shape`: config/models.py ModelShape)."""
        problems = []
        for dim in ("tp", "ulysses"):
            degree = getattr(self, dim)
            if shape.num_heads % degree or shape.num_kv_heads % degree:
                problems.append((f"layout.{dim}", f"{dim}({degree}) must divide the attention heads "
                                                  f"({shape.num_heads}) and KV heads ({shape.num_kv_heads}) of "
                                                  f"{model}"))
        if self.tp > 1 and self.ulysses > 1 and shape.num_kv_heads % (self.tp * self.ulysses):
            problems.append(("layout.ulysses", f"tp({self.tp}) * ulysses({self.ulysses}) must divide the KV heads "
                                               f"({shape.num_kv_heads}) of {model}"))
        if shape.num_layers % (self.pp * self.vpp):
            problems.append(("layout.vpp" if self.vpp > 1 else "layout.pp", f"{model} has {shape.num_layers} "
                             f"layers, not divisible by pp({self.pp}) * vpp({self.vpp})"))
        if self.ep > 1 and (shape.num_experts == 0 or shape.num_experts % self.ep):
            problems.append(("layout.ep", f"ep({self.ep}) must divide the number of experts ({shape.num_experts}) "
                                          f"of {model}"))
        return problems
