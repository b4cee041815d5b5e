"""A MindSpeed defect the emulated verl lane ran into: MindSpeed replaces `torch.distributed.all_reduce` with
`torch_all_reduce_double_dtype_bypass_wrapper` (mindspeed/core/megatron_basic/requirements_basic.py, registered by
mindspeed/features_manager/megatron_basic/requirements_basic.py torch_adaptation), which reduces a float64 tensor
as a float32 copy and rebinds the copy in its own argument list: the caller's tensor keeps its local value, with
no error. Any float64 all_reduce under MindSpeed (the verl lane's step loss of a dp2 row) is silently not reduced.

Two gloo ranks call the REAL wrapper from PARITY_MINDSPEED_SRC: float64 stays local (the defect, so a fix upstream
shows up here as a test to update), and the float32 twin through the same wrapper is reduced."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.emulated_npu import lane

pytestmark = pytest.mark.emulated_npu

RANK = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    from mindspeed.core.megatron_basic.requirements_basic import torch_all_reduce_double_dtype_bypass_wrapper

    dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2)
    all_reduce = torch_all_reduce_double_dtype_bypass_wrapper(dist.all_reduce)
    for dtype in (torch.float64, torch.float32):
        value = torch.tensor([1.0 + dist.get_rank()], dtype=dtype)
        all_reduce(value)
        print(f"{dtype} {value.item()}", flush=True)
    dist.destroy_process_group()
""")


def test_mindspeeds_all_reduce_wrapper_leaves_a_float64_tensor_unreduced(tmp_path: Path) -> None:
    src = lane.mindspeed_source()
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**lane.lane_env(src), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29617"}
    ranks = [subprocess.Popen([sys.executable, str(script), str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outputs = [p.communicate(timeout=120) for p in ranks]
    assert all(p.returncode == 0 for p in ranks), [err[-2000:] for _, err in outputs]
    for rank, (out, _) in enumerate(outputs):
        values = dict(line.split() for line in out.strip().splitlines())
        assert float(values["torch.float64"]) == 1.0 + rank  # not reduced: the caller's tensor kept its value
        assert float(values["torch.float32"]) == 3.0  # reduced (1 + 2) through the same wrapper
