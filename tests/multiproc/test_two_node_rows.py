"""The two-node rows of the Ascend matrix (scenarios/ascend_nightly.yaml, `-k 2nodes`) rehearsed on one host with
two agents, as two Ascend nodes run them: one `parity run --node-rank N --master-addr 127.0.0.1` per node, each
launcher deriving the interface variables for loopback (lo, 127.0.0.1), node 0 judging. And what the ranks of such
a launch see: the derived variables, or the runner's own, kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from parity.harness.cli import main
from parity.harness.run.launch import INTERFACE_VARS, NODE_IFNAME, TorchrunLauncher, free_port
from parity.harness.run.worker import RunJob
from tests.conftest import REPO

NIGHTLY = REPO / "scenarios" / "ascend_nightly.yaml"
LOOPBACK = {"HCCL_IF_IP": "127.0.0.1", "HCCL_SOCKET_IFNAME": "=lo", "GLOO_SOCKET_IFNAME": "lo"}
HEADER = "parity: interface lo (the route to 127.0.0.1): sets " + " ".join(f"{k}={v}" for k, v in LOOPBACK.items())


@pytest.fixture
def runner_env(monkeypatch):
    """This host's environment without interface variables (a runner may export some)."""
    for var in (*INTERFACE_VARS, NODE_IFNAME):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.slow
# two nodes of ranks and a reference: the nightly's cpu lane runs it (tests marked nightly), not .ci/run's budget
@pytest.mark.nightly
def test_the_two_node_fsdp2_row_passes_on_one_host_with_two_agents(runner_env, tmp_path, cache_dir):
    """The row exactly as the Ascend matrix ships it, on CPU (`--device cpu`): node 1 is a `parity run` process of
    its own, node 0 runs in-process and judges. Each node's log opens with what its launcher derived."""
    row = "tiny-qwen3/fsdp2/dp4-2nodes/fp32"  # its id ends in the device it runs on
    port = str(free_port())
    common = [str(NIGHTLY), "-k", row, "--device", "cpu", "--cache-dir", str(cache_dir), "--master-addr",
              "127.0.0.1", "--master-port", port]
    log1 = tmp_path / "node1.out"
    with log1.open("w") as sink:  # node 0 runs in-process below: a pipe nobody reads could fill and stall node 1
        node1 = subprocess.Popen([sys.executable, "-m", "parity.harness.cli", "run", *common, "--out",
                                  str(tmp_path / "n1"), "--node-rank", "1"], cwd=REPO, stdout=sink,
                                 stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        node0 = main(["run", *common, "--out", str(tmp_path / "n0"), "--node-rank", "0"])
        node1.wait(timeout=300)
    finally:
        if node1.poll() is None:
            node1.kill()
    assert node1.returncode == 0, log1.read_text()
    result0 = json.loads((tmp_path / "n0" / "results.jsonl").read_text())
    result1 = json.loads((tmp_path / "n1" / "results.jsonl").read_text())
    assert node0 == 0 and result0["verdict"] == "PASS", result0
    assert result0["id"] == "tiny-qwen3/fsdp2/dp4-2nodes/fp32/cpu"
    assert result1["verdict"] == "SKIP" and "node 1: its ranks finished" in result1["reasons"][0]
    record = "records/tiny-qwen3__fsdp2__dp4-2nodes__fp32__cpu"
    for node, out in ((0, "n0"), (1, "n1")):
        assert (tmp_path / out / record / f"node{node}.log").read_text().splitlines()[0] == HEADER


SITE = REPO / "tests" / "emulated_npu" / "site"


@pytest.mark.slow
@pytest.mark.nightly
def test_the_two_node_fsdp2_row_passes_as_npu_on_emulated_cards(runner_env, tmp_path, cache_dir):
    """The same row on its own device, npu, under the emulated torch_npu (PARITY_EMULATED_NPU_CARDS: the hccl
    backend over gloo; tests/multiproc/test_emulated_hccl.py): each node leases its two cards from the one lock
    directory of this host, as two `parity run --node-rank N` processes, and node 0's record is judged PASS."""
    pythonpath = os.pathsep.join([str(SITE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": pythonpath, "PARITY_EMULATED_NPU_CARDS": "8",
           "PARITY_CARD_LOCK_DIR": str(tmp_path / "cards"), "PYTHONUNBUFFERED": "1"}
    port = str(free_port())
    nodes = []
    for node in (1, 0):
        sink = (tmp_path / f"node{node}.out").open("w")
        nodes.append((node, sink, subprocess.Popen(
            [sys.executable, "-m", "parity.harness.cli", "run", str(NIGHTLY), "-k", "tiny-qwen3/fsdp2/dp4-2nodes",
             "--cache-dir", str(cache_dir), "--master-addr", "127.0.0.1", "--master-port", port, "--node-rank",
             str(node), "--out", str(tmp_path / f"n{node}")], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
            env=env)))
    try:
        for node, _, proc in nodes:
            assert proc.wait(timeout=400) == 0, (tmp_path / f"node{node}.out").read_text()[-3000:]
    finally:
        for _, sink, proc in nodes:
            if proc.poll() is None:
                proc.kill()
            sink.close()
    result = json.loads((tmp_path / "n0" / "results.jsonl").read_text())
    assert result["id"] == "tiny-qwen3/fsdp2/dp4-2nodes/fp32/npu" and result["verdict"] == "PASS", result
    record = tmp_path / "n0" / "records" / "tiny-qwen3__fsdp2__dp4-2nodes__fp32__npu"
    assert json.loads((record / "record.json").read_text())["provenance"]["device_name"] == "Emulated-NPU (CPU)"
    assert (record / "node0.log").read_text().splitlines()[0] == HEADER
    leased = {json.loads((tmp_path / f"n{n}" / record.relative_to(tmp_path / "n0") / "job.json").read_text())
              ["visible_devices"]["ASCEND_RT_VISIBLE_DEVICES"] for n in (0, 1)}
    assert len(leased) == 2  # one host: the two nodes' ranks never share a card


def _probe(tmp_path, name: str) -> dict[int, dict]:
    """Two agents of two ranks each on loopback, running the interface probe instead of an engine."""
    from parity.harness.contract.schema import Scenario

    scenario = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 4, "nodes": 2})
    job = RunJob(run_id=name, scenario=scenario.model_dump(mode="json"), record_dir=str(tmp_path / name),
                 cache_dir=str(tmp_path), provenance={}, body="tests.data.interface_probe:probe")
    result = TorchrunLauncher("127.0.0.1").launch(job, scenario.layout, 120)
    assert result.status == "ok", (result.error, result.log_tail)
    return {rank: json.loads((tmp_path / name / f"rank{rank}.interface.json").read_text()) for rank in range(4)}


@pytest.mark.slow
@pytest.mark.nightly
def test_the_ranks_get_the_derived_interface_or_the_runners_own(runner_env, tmp_path):
    """Every rank of both agents sees the loopback interface its launcher derived, and gloo works over it. Where the
    runner set a variable (planted: HCCL_IF_IP at 127.0.0.2, another loopback address; GLOO_SOCKET_IFNAME lo) the
    ranks see the runner's value and the launcher adds only what was unset."""
    derived = _probe(tmp_path, "derived")
    assert {r: (p["env"], p["node"], p["sum"]) for r, p in derived.items()} == {
        0: (LOOPBACK, 0, 4.0), 1: (LOOPBACK, 0, 4.0), 2: (LOOPBACK, 1, 4.0), 3: (LOOPBACK, 1, 4.0)}
    runner_env.setenv("HCCL_IF_IP", "127.0.0.2")
    runner_env.setenv("GLOO_SOCKET_IFNAME", "lo")
    kept = _probe(tmp_path, "kept")
    assert all(p["env"] == {**LOOPBACK, "HCCL_IF_IP": "127.0.0.2"} for p in kept.values()), kept
    header = (tmp_path / "kept" / "node0.log").read_text().splitlines()[0]
    assert header == ("parity: interface lo (GLOO_SOCKET_IFNAME=lo): sets HCCL_SOCKET_IFNAME==lo; kept from the "
                      "runner: HCCL_IF_IP=127.0.0.2 GLOO_SOCKET_IFNAME=lo")
