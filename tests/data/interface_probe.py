"""A rank body (RunJob.body) that reports what a multi-node launch handed its ranks: each rank writes the interface
variables it sees (harness/run/launch.py INTERFACE_VARS) and its node's torchrun group rank, after one gloo
all-reduce over them (gloo binds to GLOO_SOCKET_IFNAME: a name it cannot use fails here)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from parity.harness.run.launch import INTERFACE_VARS


def probe(job: Any, rank: int, world_size: int, local_rank: int, store: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    seen = {var: os.environ.get(var) for var in INTERFACE_VARS}
    report = {"env": seen, "node": int(os.environ["GROUP_RANK"]), "sum": total.item()}
    (Path(job.record_dir) / f"rank{rank}.interface.json").write_text(json.dumps(report))
