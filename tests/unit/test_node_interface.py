"""A multi-node launch pins its ranks' sockets to the interface that reaches node 0 (HCCL_IF_IP, HCCL_SOCKET_IFNAME,
GLOO_SOCKET_IFNAME: harness/run/launch.py node_interface), read from this host's real interfaces and routing table;
a value the runner set is kept; `parity plan` prints them per node; a bad interface name is refused. The two-agent
run that carries them: tests/multiproc/test_launch.py."""

from __future__ import annotations

import ipaddress

import psutil
import pytest

from parity.harness.cli import main
from parity.harness.run.launch import InterfaceError, TorchrunLauncher, node_interface
from parity.harness.run.worker import RunJob

pytestmark = pytest.mark.torch_free

LOOPBACK = {"HCCL_IF_IP": "127.0.0.1", "HCCL_SOCKET_IFNAME": "=lo", "GLOO_SOCKET_IFNAME": "lo"}


def _own_address() -> tuple[str, str] | None:
    """(interface, IPv4 address) of an interface of this host that is not loopback, if it has one."""
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family.name == "AF_INET" and not ipaddress.ip_address(addr.address).is_loopback:
                return name, addr.address
    return None


def test_a_loopback_master_is_reached_by_lo():
    found = node_interface("127.0.0.1", 29500, {})
    assert (found.name, found.address, found.env, found.kept) == ("lo", "127.0.0.1", LOOPBACK, {})
    assert node_interface("localhost", 29500, {}).name == "lo"  # a name resolves as the master's would


def test_the_master_itself_gets_the_interface_the_others_reach_not_lo():
    """On node 0 the master address is its own: `ip route get` (verl's guide) answers `dev lo` there, and HCCL would
    then offer the other nodes 127.0.0.1. The source-address match gives the interface that holds it."""
    own = _own_address()
    if own is None:
        pytest.skip("this host has no IPv4 address besides loopback")
    name, address = own
    found = node_interface(address, 29500, {})
    assert (found.name, found.env["HCCL_IF_IP"], found.env["GLOO_SOCKET_IFNAME"]) == (name, address, name)


def test_a_value_the_runner_set_is_kept():
    runner = {"HCCL_IF_IP": "10.9.9.9", "GLOO_SOCKET_IFNAME": "lo"}
    found = node_interface("127.0.0.1", 29500, runner)
    assert found.kept == runner and found.env == {"HCCL_SOCKET_IFNAME": "=lo"}
    # that the ranks get the runner's value: tests/multiproc/test_launch.py plants a GLOO_SOCKET_IFNAME gloo cannot
    # use, and the run fails in gloo, naming it


def test_a_runner_pattern_is_not_overridden_by_an_address():
    """HCCL_IF_IP takes precedence over HCCL_SOCKET_IFNAME: adding it beside the runner's pattern would undo the
    runner's choice, so only gloo's variable is added."""
    for pattern in ("^=docker", "eth,enp", "no-such-prefix"):  # an exclusion, a list, a prefix naming no interface
        found = node_interface("127.0.0.1", 29500, {"HCCL_SOCKET_IFNAME": pattern})
        assert found.env == {"GLOO_SOCKET_IFNAME": "lo"} and found.kept == {"HCCL_SOCKET_IFNAME": pattern}
    for one in ("lo", "=lo"):  # one interface, by name or exactly: its address is known
        named = node_interface("127.0.0.1", 29500, {"HCCL_SOCKET_IFNAME": one})
        assert named.env == {"HCCL_IF_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}


def test_the_runner_names_the_interface():
    own = _own_address()
    if own is None:
        pytest.skip("this host has no IPv4 address besides loopback")
    name, address = own
    found = node_interface("127.0.0.1", 29500, {"PARITY_NODE_IFNAME": name})
    assert found.env == {"HCCL_IF_IP": address, "HCCL_SOCKET_IFNAME": f"={name}", "GLOO_SOCKET_IFNAME": name}
    assert found.how == f"PARITY_NODE_IFNAME={name}"


def test_an_interface_that_is_not_here_or_a_master_that_does_not_resolve_is_refused():
    with pytest.raises(InterfaceError, match=r"PARITY_NODE_IFNAME=no-such-if0: no such interface here \(there are "):
        node_interface("127.0.0.1", 29500, {"PARITY_NODE_IFNAME": "no-such-if0"})
    # the runner's own gloo name is gloo's to refuse (kept as it is): the interface comes from the route
    kept = node_interface("127.0.0.1", 29500, {"GLOO_SOCKET_IFNAME": "no-such-if0"})
    assert kept.env == {"HCCL_IF_IP": "127.0.0.1", "HCCL_SOCKET_IFNAME": "=lo"}
    with pytest.raises(InterfaceError, match=r"cannot resolve the master address 'no-such-host\.invalid'"):
        node_interface("no-such-host.invalid", 29500, {})


def test_the_launcher_refuses_a_multi_node_run_without_an_interface(tmp_path, monkeypatch):
    """Refused before any torchrun starts: no node log, the error names the variable."""
    from parity.harness.contract.schema import Scenario

    scenario = Scenario(model="tiny-qwen3", strategy="fsdp2", layout={"dp": 2, "nodes": 2})
    job = RunJob(run_id="r", scenario=scenario.model_dump(mode="json"), record_dir=str(tmp_path / "rec"),
                 cache_dir=str(tmp_path), provenance={})
    monkeypatch.setenv("PARITY_NODE_IFNAME", "no-such-if0")
    result = TorchrunLauncher("127.0.0.1", master_port=29500).launch(job, scenario.layout, 30)
    assert result.status == "error" and result.error.startswith("refused to launch: PARITY_NODE_IFNAME=no-such-if0")
    assert not list((tmp_path / "rec").glob("node*.log"))


TWO_NODE = "matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 16, nodes: 2}, workload: {batch_size: 16}}\n"
ONE_NODE = "matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}}\n"


def _interface_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("interface env")]


def test_plan_prints_each_nodes_interface_env(write_yaml, capsys, monkeypatch):
    for var in ("PARITY_NODE_IFNAME", *LOOPBACK):
        monkeypatch.delenv(var, raising=False)
    path = write_yaml(TWO_NODE)
    # every node on this host (the rehearsal): the values each launcher will set
    assert main(["plan", str(path), "--device", "npu", "--master-addr", "127.0.0.1", "--master-port", "6000"]) == 0
    out = capsys.readouterr().out
    expected = " ".join(f"{k}={v}" for k, v in LOOPBACK.items())
    assert [line.endswith(expected) for line in _interface_lines(out)] == [True, True], out
    assert "this host: interface lo (the route to 127.0.0.1): sets " + expected in out
    # remote nodes: only each node can tell; the plan says what it will derive
    assert main(["plan", str(path), "--device", "npu", "--master-addr", "10.0.0.1", "--master-port", "6000"]) == 0
    lines = _interface_lines(capsys.readouterr().out)
    assert len(lines) == 2 and all(f"HCCL_IF_IP=<node {n}'s address toward 10.0.0.1>" in lines[n] for n in (0, 1))
    # a single-node row pins nothing
    assert main(["plan", str(write_yaml(ONE_NODE, name="one.yaml")), "--device", "npu"]) == 0
    out = capsys.readouterr().out
    assert not _interface_lines(out) and "this host:" not in out


def test_plan_keeps_the_runners_value_and_refuses_a_bad_interface(write_yaml, capsys, monkeypatch):
    path = write_yaml(TWO_NODE)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.delenv("HCCL_IF_IP", raising=False)
    monkeypatch.delenv("HCCL_SOCKET_IFNAME", raising=False)
    assert main(["plan", str(path), "--device", "npu", "--master-addr", "127.0.0.1"]) == 0
    out = capsys.readouterr().out
    assert all("GLOO_SOCKET_IFNAME" not in line for line in _interface_lines(out))
    assert "kept from the runner: GLOO_SOCKET_IFNAME=lo" in out
    monkeypatch.setenv("PARITY_NODE_IFNAME", "no-such-if0")
    assert main(["plan", str(path), "--device", "npu", "--master-addr", "127.0.0.1"]) == 2
    assert "PARITY_NODE_IFNAME=no-such-if0: no such interface here" in capsys.readouterr().err
