"""Lazy read-only view of an HF safetensors checkpoint: each rank reads only the tensors its shard needs."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch


class SafetensorsCheckpoint(Mapping[str, torch.Tensor]):
    """name -> tensor over `model.safetensors` or a sharded `model.safetensors.index.json`."""

    def __init__(self, directory: Path) -> None:
        directory = Path(directory)
        index = directory / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._files = {name: directory / file for name, file in weight_map.items()}
        else:
            single = directory / "model.safetensors"
            if not single.is_file():
                raise FileNotFoundError(f"{directory} has neither model.safetensors nor its index (only safetensors "
                                        "checkpoints are supported)")
            from safetensors import safe_open

            with safe_open(str(single), "pt") as handle:
                self._files = dict.fromkeys(handle.keys(), single)
        self._cache: tuple[str, torch.Tensor] | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._cache is not None and self._cache[0] == name:
            return self._cache[1]
        from safetensors import safe_open

        with safe_open(str(self._files[name]), "pt") as handle:
            tensor = handle.get_tensor(name)
        self._cache = (name, tensor)  # fused expert tensors are indexed once per expert
        return tensor

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)
