"""`parity plan` prints, without running, the commands and card assignment of each scenario."""

from __future__ import annotations

import pytest

from parity.harness.cli import main

pytestmark = pytest.mark.torch_free

TWO_NODE = "matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 16, nodes: 2}, workload: {batch_size: 16}}\n"


def test_plan_for_a_two_node_npu_job(write_yaml, capsys):
    path = write_yaml(TWO_NODE)
    assert main(["plan", str(path), "--device", "npu", "--master-addr", "10.0.0.1", "--master-port", "6000"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny-qwen3/fsdp2/dp16-2nodes/fp32/npu\n")
    assert "world size 16 = dp(16) * tp(1) * pp(1) * cp(1) * ulysses(1)" in out and "backend hccl" in out
    for node in (0, 1):
        assert f"  node {node}: cards 0,1,2,3,4,5,6,7" in out
        assert (f"--nnodes=2 --node-rank={node} --nproc-per-node=8 --rdzv-backend=static "
                f"--rdzv-endpoint=10.0.0.1:6000") in out
        assert f"--node-rank {node} --master-addr 10.0.0.1 --master-port 6000" in out
    assert out.count("ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7") == 2
    assert ("HCCL_DETERMINISTIC=true CLOSE_MATMUL_K_SHIFT=1 ATB_MATMUL_SHUFFLE_K_ENABLE=0 LCCL_DETERMINISTIC=1 "
            "ATB_LLM_LCOC_ENABLE=0") in out
    assert "here: would SKIP (device npu: torch_npu is not installed" in out


def test_plan_on_cpu_has_no_cards(write_yaml, capsys):
    path = write_yaml("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}}\n")
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "cards none (cpu)" in out and "backend gloo" in out and "would SKIP" not in out
