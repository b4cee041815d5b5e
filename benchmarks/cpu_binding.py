"""Benchmark: CPU ranks pinned to their own cores (devices.bind_cpu_rank) against ranks left to the OS scheduler
(PARITY_CPU_BIND=0): the latency of one gloo all-reduce, then real scenarios of the default matrix under
`parity run`, the two settings alternated so that a noisy neighbour hits both.

Prints figures; asserts nothing (speed goals are measured here, never in timed unit tests).

    python benchmarks/cpu_binding.py [--repeats 2] [-k "megatron and tp2"]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch.multiprocessing as mp

from parity.harness.config.paths import RESULTS
from parity.harness.run.launch import free_port
from parity.reports import results as results_file

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {"pinned": "1", "unpinned": "0"}


def _all_reduce_rank(rank: int, world: int, port: int, calls: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from parity.harness.config.devices import bind_cpu_rank

    bind_cpu_rank(rank, world)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tensor = torch.ones(1024)
    for _ in range(20):
        dist.all_reduce(tensor)
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        dist.all_reduce(tensor)
    if rank == 0:
        queue.put(((time.perf_counter() - started) / calls, (time.process_time() - cpu) / calls))
    dist.destroy_process_group()


def all_reduce_latency(world: int, bind: str, calls: int) -> tuple[float, float]:
    os.environ["PARITY_CPU_BIND"] = bind  # read by each spawned rank
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_all_reduce_rank, args=(world, free_port(), calls, queue), nprocs=world)
    return queue.get()


def matrix_run(bind: str, select: str, out: Path, cache: Path) -> tuple[float, float, int]:
    """(sum of scenario wall s, sum of rank compute s, scenarios) of one `parity run` of the selection."""
    subprocess.run([sys.executable, "-m", "parity.harness.cli", "run", "scenarios/cpu.yaml", "-k", select, "--out",
                    str(out), "--cache-dir", str(cache)], cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PARITY_CPU_BIND": bind})
    metrics = [r["metrics"] for r in results_file.read(out / RESULTS)]
    return (sum(m.get("wall_time_s", 0) for m in metrics), sum(m.get("compute_time_s", 0) for m in metrics),
            len(metrics))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("-k", default="megatron or fsdp2", help="which rows of scenarios/cpu.yaml to run")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; gloo all-reduce of 1024 fp32, median of {args.repeats} x {args.calls} calls")
    print(f"{'ranks':>5} {'setting':<9} {'wall us':>8} {'rank 0 cpu us':>14}")
    for world in (2, 4):
        for name, bind in SETTINGS.items():
            figures = [all_reduce_latency(world, bind, args.calls) for _ in range(args.repeats)]
            print(f"{world:>5} {name:<9} {statistics.median(f[0] for f in figures) * 1e6:>8.0f} "
                  f"{statistics.median(f[1] for f in figures) * 1e6:>14.0f}")
    cache = Path(tempfile.mkdtemp())
    matrix_run("1", args.k, cache / "warm-up", cache)  # checkpoints and references, out of the figures
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in SETTINGS}
    for repeat in range(args.repeats):
        for name, bind in SETTINGS.items():
            runs[name].append(matrix_run(bind, args.k, cache / f"{name}-{repeat}", cache))
    print(f"\nparity run scenarios/cpu.yaml -k {args.k!r}, median of {args.repeats}")
    print(f"{'setting':<9} {'scenarios':>9} {'scenario wall s':>16} {'rank compute s':>15}")
    for name, figures in runs.items():
        print(f"{name:<9} {figures[0][2]:>9} {statistics.median(f[0] for f in figures):>16.1f} "
              f"{statistics.median(f[1] for f in figures):>15.1f}")


if __name__ == "__main__":
    main()
