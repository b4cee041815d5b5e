"""Launch containment: a crashing rank is an ERROR with its log tail, a hanging run is killed at its timeout
with no process left behind, and neither loses the other scenarios' results. Plus the torchrun launcher on two
nodes (two launchers on loopback, as two Ascend nodes would run; one node: tests/multiproc/test_signals.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from parity.harness.cli import main
from parity.harness.contract.schema import Scenario
from tests.conftest import REPO

MIXED = """
defaults: {device: cpu, model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}}
matrix:
  - {faults: [{kind: crash, rank: 1, step: 1}], timeout: 60}
  - {name: ok}
  - {faults: [{kind: hang, rank: 1, step: 1}], timeout: 5}
  - {name: ok-after-hang, workload: {seed: 5}}
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "zombie" not in status.read()
    except FileNotFoundError:
        return False


def test_crash_and_hang_are_contained(write_yaml, tmp_path, cache_dir):
    path = write_yaml(MIXED)
    out = tmp_path / "out"
    # `parity run` in-process, on the session's warm forkserver (a fresh interpreter would import torch again; the
    # CLI as a process is tested by test_cli, test_bad_input and test_signals)
    assert main(["run", str(path), "--out", str(out), "--cache-dir", str(cache_dir)]) == 1
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    verdicts = {r["id"]: r for r in lines}
    assert len(lines) == 4
    crash = verdicts["tiny-qwen3/fsdp2/dp2/fp32/cpu+crash"]
    assert crash["verdict"] == "ERROR"
    assert "rank 1 died first: InjectedCrash" in crash["reasons"][0]  # rank 0 dies of the broken connection, later
    assert "InjectedCrash: injected crash on rank 1 at step 1" in crash["log_tail"]
    hang = verdicts["tiny-qwen3/fsdp2/dp2/fp32/cpu+hang"]
    assert hang["verdict"] == "ERROR" and "timeout" in hang["reasons"][0]
    assert "injected hang on rank 1" in hang["log_tail"]
    assert verdicts["tiny-qwen3/fsdp2/dp2/fp32/cpu+ok"]["verdict"] == "PASS"
    assert verdicts["tiny-qwen3/fsdp2/dp2/fp32/cpu+ok-after-hang"]["verdict"] == "PASS"
    # the hung ranks printed their pids: none may survive the launcher
    pids = [int(pid) for pid in re.findall(r"\(pid (\d+)\)", hang["log_tail"])]
    assert pids and not any(_alive(pid) for pid in pids)


DEATHS = {"SegfaultEngine": "killed by SIGSEGV (signal 11)", "KilledEngine": "killed by SIGKILL (signal 9)",
          "ExitZeroEngine": "exited with code 0 before finishing its run"}


@pytest.mark.parametrize("engine", sorted(DEATHS))
def test_the_rank_that_died_first_is_named_first_with_its_signal(runner, engine):
    """Rank 1 dies without raising (tests/data/dying_engine.py) while rank 0 waits in the step's collective: rank 0
    then fails of the lost connection, a moment later. The error names rank 1 and how it died, rank 0 after it;
    the log tail opens on rank 1's log. (Before: 'rank 0 failed first: RuntimeError: ... Connection reset by
    peer', the cause absent or last.) torchrun's path reads the same markers and torchrun's own failure report:
    tests/unit/test_deaths.py."""
    scenario = Scenario(model="tiny-qwen3", engine=f"tests.data.dying_engine:{engine}", layout={"dp": 2},
                        timeout=120)
    record = runner.execute(scenario, f"dies-{engine}", runner.options.out_dir / f"dies-{engine}")
    assert record.status == "error", record
    assert record.error.startswith(f"rank 1 died first: {DEATHS[engine]}"), record.error
    assert "rank 0" not in record.error.split(";")[0] and "; then rank 0: " in record.error
    first = record.log_tail.splitlines()[0]
    assert first == f"--- {runner.options.out_dir / f'dies-{engine}' / 'rank1.log'}", record.log_tail


def test_forked_launcher_kills_hung_ranks(runner, write_yaml):
    from parity.harness.config.matrix import load_file

    scenario = load_file(write_yaml(MIXED))[2].model_copy(update={"timeout": 2})  # killed at its timeout, not later
    record = runner.execute(scenario, "hang-direct", runner.options.out_dir / "hang-direct")
    assert record.status == "timeout"
    assert 2 <= record.wall_time_s < 14


@pytest.mark.slow
# multi-node launch: the nightly's cpu lane runs it beside its two-node rehearsal (nightly.yml), not .ci/run
@pytest.mark.nightly
def test_two_nodes_on_loopback(write_yaml, tmp_path, cache_dir):
    """Node 1 and node 0 are separate `parity run` processes meeting at one rendezvous port; node 0 judges."""
    from parity.harness.run.launch import free_port

    path = write_yaml("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2, nodes: 2}, timeout: 120}\n")
    port = str(free_port())
    common = ["--cache-dir", str(cache_dir), "--master-addr", "127.0.0.1", "--master-port", port]
    log1 = tmp_path / "node1.log"
    with log1.open("w") as sink:  # node 0 runs in-process below: a pipe nobody reads could fill and stall node 1
        node1 = subprocess.Popen([sys.executable, "-m", "parity.harness.cli", "run", str(path), "--out",
                                  str(tmp_path / "n1"), "--node-rank", "1", *common], cwd=REPO, stdout=sink,
                                 stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        node0 = main(["run", str(path), "--out", str(tmp_path / "n0"), "--node-rank", "0", *common])
        node1.wait(timeout=180)
    finally:
        if node1.poll() is None:
            node1.kill()
    assert node0 == 0
    assert node1.returncode == 0, log1.read_text()
    result0 = json.loads((tmp_path / "n0" / "results.jsonl").read_text())
    result1 = json.loads((tmp_path / "n1" / "results.jsonl").read_text())
    assert result0["verdict"] == "PASS" and result0["id"] == "tiny-qwen3/fsdp2/dp2-2nodes/fp32/cpu"
    assert result1["verdict"] == "SKIP" and "node 0 compares and reports" in result1["reasons"][0]
    assert result0["metrics"]["logprob_max_abs"] < 5e-5


FORKSERVER_PROBE = """
from multiprocessing import forkserver
from parity.harness.run.launch import _ensure_forkserver, expect_preload

import time

def server():
    pid = forkserver._forkserver._forkserver_pid
    # until the spawned server has exec'd, /proc/PID/cmdline reads empty or as this process's own (which names
    # forkserver too): wait for another command line
    own = open("/proc/self/cmdline").read()
    for _ in range(500):
        if (cmdline := open(f"/proc/{pid}/cmdline").read()) not in ("", own):
            return pid, cmdline
        time.sleep(0.01)
    raise AssertionError(f"forkserver {pid} never started")

_ensure_forkserver(["json"]); first = server()
_ensure_forkserver(["json"]); assert server() == first, "a server with what it needs is reused"
forkserver._forkserver._stop()  # what an in-process `parity run` does when it ends
forkserver._forkserver.set_forkserver_preload(["json"]); forkserver._forkserver.ensure_running()  # someone else's
_ensure_forkserver(["json", "csv"]); heavier = server()
assert heavier[0] != first[0] and "'csv'" in heavier[1], "one started with less is restarted with the full preload"
_ensure_forkserver(["json"]); assert server() == heavier, "a lighter launcher reuses the heavier server"
_ensure_forkserver(["json"], exclude=["csv"]); clean = server()
assert clean[0] != heavier[0] and "'csv'" not in clean[1], "a server holding an excluded module is replaced"
expect_preload(["csv", "uuid"])  # the pytest plugin: what the session's items will ask for
_ensure_forkserver(["json", "wave"]); expected = server()
assert expected[0] != clean[0] and all(f"'{m}'" in expected[1] for m in ("wave", "csv", "uuid")), expected
_ensure_forkserver(["uuid"]); assert server() == expected, "a later launch needing an expected module reuses it"
_ensure_forkserver(["json"], exclude=["uuid"]); no_uuid = server()
assert "'uuid'" not in no_uuid[1] and "'csv'" in no_uuid[1], "expected modules an engine excludes are left out"
print("ok")
"""


def test_the_forkserver_is_restarted_when_it_lacks_the_preload_or_holds_an_excluded_module():
    """multiprocessing keeps one forkserver per process, started with whatever preload was set last: after a
    `parity run` in the same process closed it, a runner that planned only hf rows restarted it without
    megatron.core, and every later Megatron rank imported megatron itself (the megatron rows of a full pytest
    session ran 2-4x slower than alone)."""
    result = subprocess.run([sys.executable, "-c", FORKSERVER_PROBE], capture_output=True, text=True, timeout=60,
                            cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


MAIN_SCRIPT = """
import multiprocessing, sys, time
from pathlib import Path
if __name__ == "__mp_main__":  # a forked rank importing this script again
    Path(sys.argv[1]).write_text("imported")
if __name__ == "__main__":
    from parity.harness.run.launch import _main_module_hidden
    context = multiprocessing.get_context("forkserver")
    hidden = sys.argv[2] == "hidden"
    proc = context.Process(target=time.sleep, args=(0,))
    if hidden:
        with _main_module_hidden():
            proc.start()
    else:
        proc.start()
    proc.join()
    assert __file__ and __spec__ is None  # the caller's main is whole again
"""


@pytest.mark.parametrize("mode", ["hidden", "plain"])
def test_ranks_start_without_importing_the_callers_main_module(tmp_path, mode):
    """multiprocessing makes every forkserver child import the parent's __main__ again; under `parity run` that
    is the CLI with the reports and matplotlib, most of a tiny scenario's overhead. The plain start shows the probe
    sees the import."""
    script, marker = tmp_path / "main.py", tmp_path / "imported"
    script.write_text(MAIN_SCRIPT)
    result = subprocess.run([sys.executable, str(script), str(marker), mode], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert marker.exists() == (mode == "plain")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PARITY_REHEARSE_NODES") != "1", reason="the nightly CPU job's two-node rehearsal "
                    "runs it (PARITY_REHEARSE_NODES=1; about a minute on two cores, over .ci/run's budget)")
def test_two_node_rehearsal_with_c10d_passes_the_row_the_single_node_run_passes(write_yaml, tmp_path, cache_dir):
    """The nightly CPU job's two-node rehearsal (`parity run --nodes 2 --launcher torchrun --rdzv c10d`): the same row
    run on one node (forked) and over two torchrun agents that meet at a c10d store PASSes both ways, with the same
    numbers (gloo reduces two ranks in the same order whatever agent hosts them). A row that cannot split is bad
    input naming it."""
    from safetensors.torch import load_file

    from parity.harness.run.launch import torchrun_commands

    path = write_yaml("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2}, timeout: 240,\n"
                      "     workload: {batch_size: 4, prompt_len: 8, response_len: 8, steps: 2}}\n")
    common = ["--cache-dir", str(cache_dir)]
    assert main(["run", str(path), "--out", str(tmp_path / "one"), *common]) == 0
    assert main(["run", str(path), "--out", str(tmp_path / "two"), "--nodes", "2", "--launcher", "torchrun",
                 "--rdzv", "c10d", *common]) == 0
    one = json.loads((tmp_path / "one" / "results.jsonl").read_text())
    two = json.loads((tmp_path / "two" / "results.jsonl").read_text())
    assert one["verdict"] == two["verdict"] == "PASS"
    assert two["id"] == "tiny-qwen3/fsdp2/dp2-2nodes/fp32/cpu"
    record = tmp_path / "two" / "records" / "tiny-qwen3__fsdp2__dp2-2nodes__fp32__cpu"
    assert (record / "node0.log").is_file() and (record / "node1.log").is_file()  # two agents on this host
    job = json.loads((record / "job.json").read_text())
    assert job["scenario"]["layout"]["nodes"] == 2
    single = load_file(tmp_path / "one" / "records" / "tiny-qwen3__fsdp2__dp2__fp32__cpu" / "tensors.safetensors")
    split = load_file(record / "tensors.safetensors")
    assert single.keys() == split.keys() and all(single[k].equal(split[k]) for k in single)
    commands = torchrun_commands(Scenario.model_validate(job["scenario"]).layout, record / "job.json", "127.0.0.1",
                                 29500, "id", rdzv="c10d")
    assert all("--rdzv-backend=c10d" in c and not any(a.startswith("--node-rank") for a in c) for c in commands)
    static = torchrun_commands(Scenario.model_validate(job["scenario"]).layout, record / "job.json", "127.0.0.1",
                               29500, "id")
    assert [c[c.index("--rdzv-backend=static") - 2] for c in static] == ["--node-rank=0", "--node-rank=1"]
    odd = write_yaml("matrix:\n  - {model: tiny-qwen3, strategy: hf}\n", name="odd.yaml")
    assert main(["run", str(odd), "--out", str(tmp_path / "odd"), "--nodes", "2", *common]) == 2
