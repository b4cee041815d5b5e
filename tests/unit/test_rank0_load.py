"""fsdp2 loads a model as verl's FSDP engine does: rank 0 reads the checkpoint on the host, every other rank builds
the model on the meta device (no rank but 0 ever holds the whole model), and the tensors reach every rank's shards
by broadcast from rank 0 (checked end to end by the fsdp2 rows, which are bit-identical to every rank loading)."""

from __future__ import annotations

from pathlib import Path

import torch

from parity.engines.hf.common import load_on_rank0
from parity.harness.config.models import ensure_checkpoint
from parity.harness.contract.engine import EngineContext
from parity.harness.contract.schema import Scenario


def _ctx(rank: int, checkpoint: Path) -> EngineContext:
    scenario = Scenario(model="tiny-llama", strategy="fsdp2", layout={"dp": 2})
    return EngineContext(scenario=scenario, checkpoint=checkpoint, rank=rank, world_size=2, local_rank=rank,
                         device=torch.device("cpu"))


def test_only_rank_0_reads_the_weights(cache_dir: Path):
    checkpoint = ensure_checkpoint("tiny-llama", cache_dir)
    model0, state = load_on_rank0(_ctx(0, checkpoint))
    model1, nothing = load_on_rank0(_ctx(1, checkpoint))
    assert nothing is None and all(p.is_meta for p in model1.parameters())
    assert state is not None and not any(p.is_meta for p in model0.parameters())
    assert set(state) == set(model1.state_dict())  # the broadcast fills every tensor the meta model has
    assert all(torch.equal(state[k], v) for k, v in model0.state_dict().items())
