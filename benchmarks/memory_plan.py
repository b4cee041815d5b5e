"""Benchmark: the per-rank memory plan (harness/config/memory.py) against what real runs measure on CPU.

A 21 M-parameter Qwen3 (random weights, saved as a safetensors checkpoint) runs under `parity run` with the
harness's own engines in several layouts. Each engine is wrapped (MeasuredX below) only to watch it: torch's
profiler records every CPU tensor allocation and free from the start of the engine's setup to the end of its last
training step, and the measured peak of a rank is the largest total of live tensor bytes it saw — the model, its
states, the activations and every transient, without the runtime. The worst rank counts. (Peak RSS is printed
too; glibc's heaps make it grow with fragmentation, so it is not what the plan is checked against.) The plan is
computed for the same scenario with the engine's built-in strategy on device cpu.

Prints a table (docs/ascend.md has one) and exits 1 when a layout is off by more than --limit (default 25 %).

    python benchmarks/memory_plan.py [--limit 0.25] [-k "megatron"]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from parity.harness.config.paths import RECORD, RECORDS

REPO = Path(__file__).resolve().parents[1]
#: big enough that states and activations dwarf allocator noise, small enough for a 2-core box
QWEN3_21M = {"vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
             "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "tie_word_embeddings": False,
             "max_position_embeddings": 1024, "model_type": "qwen3"}
#: name -> the row's scenario fields (as in scenarios/*.yaml); each runs its strategy's engine wrapped (Measured_*)
LAYOUTS: dict[str, dict[str, Any]] = yaml.safe_load("""
hf single: {strategy: hf, workload: {batch_size: 32, prompt_len: 32, response_len: 32}}
fsdp2 dp2: {strategy: fsdp2, layout: {dp: 2}, workload: {batch_size: 32, prompt_len: 32, response_len: 32}}
megatron tp2, 4 micro-batches:
  {strategy: megatron, layout: {tp: 2}, workload: {batch_size: 32, prompt_len: 64, response_len: 64},
   mcore_kwargs: {micro_batch_size: 8}}
megatron pp2, 1F1B, 4 micro-batches:
  {strategy: megatron, layout: {pp: 2}, workload: {batch_size: 32, prompt_len: 64, response_len: 64},
   mcore_kwargs: {micro_batch_size: 8}}
megatron tp2-sp, full recompute:
  {strategy: megatron, layout: {tp: 2, sequence_parallel: true},
   workload: {batch_size: 32, prompt_len: 64, response_len: 64},
   mcore_kwargs: {micro_batch_size: 32, recompute_granularity: full, recompute_method: uniform,
                  recompute_num_layers: 1}}
""")


def _slug(name: str) -> str:
    return name.replace(" ", "_").replace(",", "")


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _live_peak(trace: Path) -> int:
    """The largest total of live tensor bytes in a profiler trace (its '[memory]' events)."""
    events = json.loads(trace.read_text())["traceEvents"]
    return max((e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"), default=0)


def _measured(base: type) -> type:
    class Measured(base):  # type: ignore[misc,valid-type]
        """The engine as it is, its tensor allocations recorded from setup to the last training step."""

        def setup(self) -> None:
            import torch.profiler

            self._rss_at_setup = _rss()
            self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                    profile_memory=True)
            self._profiler.__enter__()
            super().setup()

        def train_step(self, batch: Any, old_logprobs: Any, step: int) -> Any:
            out = super().train_step(batch, old_logprobs, step)
            if step == self.ctx.scenario.workload.steps:
                self._profiler.__exit__(None, None, None)
                with tempfile.TemporaryDirectory() as folder:
                    keep = os.environ.get("PARITY_MEMORY_TRACES")  # --keep-traces: a folder for the traces
                    trace = Path(keep or folder) / f"{self.ctx.scenario.name}-rank{self.ctx.rank}.json"
                    self._profiler.export_chrome_trace(str(trace))
                    self._live_peak = _live_peak(trace)
            return out

        def run_provenance(self) -> dict[str, Any]:
            import torch.distributed as dist

            own = getattr(super(), "run_provenance", dict)()
            peaks = [0] * self.ctx.world_size
            dist.all_gather_object(peaks, self._live_peak)
            return {**own, "rss_at_setup": self._rss_at_setup, "live_peak_per_rank": peaks}

    Measured.__name__ = Measured.__qualname__ = f"Measured{base.__name__}"
    return Measured


def __getattr__(name: str) -> type:
    """`Measured_<strategy>`: that built-in engine wrapped, built when a rank imports it (importing this module
    imports no engine)."""
    strategy = name.removeprefix("Measured_")
    if strategy == name:
        raise AttributeError(name)
    from parity.harness.config.registry import SPECS, import_path

    return _measured(import_path(SPECS[strategy].engine))


def write_checkpoint(directory: Path) -> Path:
    import torch
    import transformers

    if (directory / "model.safetensors").is_file():
        return directory
    torch.manual_seed(0)
    config = transformers.Qwen3Config(**{k: v for k, v in QWEN3_21M.items() if k != "model_type"})
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=0.25)
    parser.add_argument("-k", default="", help="substring of the layout names to run")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "parity-memory-plan")
    parser.add_argument("--keep-traces", action="store_true", help="keep each rank's profiler trace under WORK/traces")
    args = parser.parse_args()

    from parity.harness.config.memory import estimate
    from parity.harness.contract.schema import Scenario

    checkpoint = write_checkpoint(args.work / "qwen3-21m")
    chosen = {name: row for name, row in LAYOUTS.items() if args.k in name}
    matrix = [{**{k: v for k, v in row.items() if k != "strategy"}, "engine": f"benchmarks.memory_plan:Measured_"
               f"{row['strategy']}", "workload": {**row["workload"], "steps": 2}, "name": _slug(name)}
              for name, row in chosen.items()]
    scenarios = args.work / "scenarios.yaml"
    scenarios.write_text(json.dumps({"defaults": {"model": str(checkpoint), "device": "cpu", "dtype": "fp32",
                                                  "timeout": 1200}, "matrix": matrix}))
    out = args.work / "out"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    if args.keep_traces:
        (args.work / "traces").mkdir(parents=True, exist_ok=True)
        env["PARITY_MEMORY_TRACES"] = str(args.work / "traces")
    proc = subprocess.run([sys.executable, "-m", "parity.harness.cli", "run", str(scenarios), "--out", str(out)],
                          cwd=REPO, env=env, check=False)
    if proc.returncode not in (0, 1):
        return proc.returncode
    records = {p.parent.name: json.loads(p.read_text()) for p in (out / RECORDS).glob(f"*/{RECORD}")}
    config = json.loads((checkpoint / "config.json").read_text())
    rows, worst = [], 0.0
    for name, row in chosen.items():
        record = next((r for d, r in records.items() if d.endswith(_slug(name))), None)
        if record is None or "live_peak_per_rank" not in record["provenance"]:
            rows.append((name, "-", "-", "-", "-", "no record"))
            worst = float("inf")
            continue
        measured = max(record["provenance"]["live_peak_per_rank"])
        rss = max(record["peak_memory_per_rank"]) - record["provenance"]["rss_at_setup"]
        plan = estimate(Scenario(model=str(checkpoint), device="cpu", dtype="fp32",
                                 **{**row, "workload": {**row["workload"], "steps": 2}}), config)
        error = plan.total / measured - 1
        worst = max(worst, abs(error))
        rows.append((name, f"{measured / 1e6:.0f}", f"{plan.total / 1e6:.0f}", f"{error:+.0%}", f"{rss / 1e6:.0f}",
                     plan.in_flight))
    header = ("layout", "measured MB", "planned MB", "plan vs measured", "peak RSS growth MB", "activations counted")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
    print(f"worst |plan / measured - 1| = {worst:.0%} (limit {args.limit:.0%})")
    return 0 if worst <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
