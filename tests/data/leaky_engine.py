"""A deliberately leaky engine: it accepts fsdp_kwargs but never passes `reshard_after_forward` on to
fully_shard — the flaw verl's mindspeed_fsdp had. The kwargs-propagation check must FAIL it."""

from __future__ import annotations

from typing import Any

from parity.engines.fsdp2.engine import FSDP2Engine


class LeakyFSDP2Engine(FSDP2Engine):
    def fully_shard_settings(self, given: dict[str, Any]) -> dict[str, Any]:
        return super().fully_shard_settings({k: v for k, v in given.items() if k != "reshard_after_forward"})
