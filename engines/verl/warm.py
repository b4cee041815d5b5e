"""Imported by the forkserver (EngineSpec.preload of the verl engines): verl's import costs a rank seconds, so the
server imports it once. verl resolves its platform while its engine modules import, so on a machine without an
accelerator the CPU platform is chosen first (engines/verl/shims.py). Importing this module is the switch."""

from __future__ import annotations

import contextlib

import torch

from parity.engines.verl import shims, source

source.activate()
if source.problem() is None:
    accelerator = torch.cuda.is_available() or hasattr(torch, "npu")
    if not accelerator:
        shims.select_platform("cpu", "cuda")
    with contextlib.suppress(ImportError):
        import verl.workers.engine
        import verl.workers.utils.losses  # noqa: F401

        from parity.engines.verl import config
        from parity.engines.verl.fsdp import VerlFSDPEngine

        # Hydra's composition of verl's trainer config would cost each rank its own per row: composed here once,
        # every forked rank starts from a copy of it (engines/verl/config.py compose)
        config.compose(VerlFSDPEngine.config_name)
