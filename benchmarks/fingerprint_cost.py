"""Benchmark: what the first-forward fingerprint (harness/contract/fingerprint.py) costs a row, how far clean runs
move each module's figures, and how often planted faults are named at their module.

Cost: the hooked forward minus the plain one (the fastest of --repeats, in this process, on the same tiny model and
batch), as a share of a real row's compute time (its RunRecord.compute_time_s, launched here). The goal: <= 5 %.
Clean: whether every module of the clean rows stays inside its limit
(harness/judge/fingerprint.REL_LIMIT). Planted (--planted): every case of tests/data/planted_modules.ALL.

    python benchmarks/fingerprint_cost.py [--models tiny-qwen3,tiny-qwen3-moe] [--repeats 7] [--planted]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from parity.harness.config.models import ensure_checkpoint, model_shape
from parity.harness.config.paths import record_dir
from parity.harness.config.selection import select
from parity.harness.contract.fingerprint import Recorder, hf_points
from parity.harness.contract.schema import Scenario
from parity.harness.contract.workload import Workload, build_batch
from parity.harness.judge.fingerprint import REL_LIMIT, module_rel
from parity.harness.run.records import RunRecord
from parity.harness.runner import Runner, RunOptions

ROWS = "fp32/cpu and not + and (/dp2/ or /tp2-sp/)"
"""The default matrix's clean data- and sequence-parallel fp32 rows (of --models): their time is what the
fingerprint is a share of."""


REPO = Path(__file__).resolve().parents[1]


def clean_worst(runner: Runner, scenario: Scenario) -> float:
    """The largest per-module move of a run against its reference (what REL_LIMIT must stay above)."""
    candidate = RunRecord.load(record_dir(runner.options.out_dir, scenario.id))
    reference = runner._reference(scenario)
    if not candidate.fingerprint or not reference.fingerprint:
        return float("nan")
    ref = reference.fingerprint["modules"]
    return max(module_rel(stats, ref[name]) for name, stats in candidate.fingerprint["modules"].items()
               if name in ref)


def forward_seconds(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, repeats: int) -> tuple[float, float]:
    """(plain, hooked) forward seconds, interleaved, the fastest of each: the least-disturbed runs on a shared box."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * repeats):
        hooked = bool(i % 2)
        with torch.no_grad():
            t0 = time.perf_counter()
            if hooked:
                with Recorder(hf_points(model)) as recorder:
                    model(input_ids=ids, attention_mask=mask)
                recorder.gather()
            else:
                model(input_ids=ids, attention_mask=mask)
            times[hooked].append(time.perf_counter() - t0)
    return min(times[False]), min(times[True])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-qwen3,tiny-qwen3-moe")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("-k", default=ROWS, help="rows of scenarios/cpu.yaml to time (of --models)")
    parser.add_argument("--planted", action="store_true", help="also run every planted fault (a few minutes)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    out = Path(tempfile.mkdtemp(prefix="fingerprint-cost-"))
    runner = Runner(RunOptions(out_dir=out / "out", cache_dir=out / "cache"))
    worst_share = 0.0
    try:
        for name in args.models.split(","):
            checkpoint = ensure_checkpoint(name, out / "cache")
            model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
            batch = build_batch(Workload(), model_shape(name).vocab_size)
            plain, hooked = forward_seconds(model, batch.input_ids, batch.attention_mask, args.repeats)
            for scenario in select([REPO / "scenarios" / "cpu.yaml"], args.k, None):
                if scenario.model != name:
                    continue
                verdict = runner.run_scenario(scenario)
                record_time = verdict.metrics.get("compute_time_s") or float("nan")
                share = (hooked - plain) / record_time
                worst_share = max(worst_share, share)
                worst = clean_worst(runner, scenario)
                print(f"{scenario.id:<40} forward {plain * 1e3:7.2f} ms, hooked {hooked * 1e3:7.2f} ms; row compute "
                      f"{record_time:6.2f} s; fingerprint share {share:.2%}; {verdict.status}; worst module rel "
                      f"{worst:.2e} (limit {REL_LIMIT[scenario.dtype]:.0e})")
        print(f"clean rows are judged against the limit {REL_LIMIT['fp32']:.0e} (fp32); lines above")
        print(f"worst fingerprint share of a row: {worst_share:.2%} (goal <= 5%)")
        if args.planted:
            sys.path.insert(0, str(REPO))  # tests/data
            from tests.data.planted_modules import ALL

            named = 0
            for engine, (model_name, module) in ALL.items():
                verdict = runner.run_scenario(Scenario(model=model_name, engine=f"tests.data.planted_modules:{engine}",
                                                       timeout=300))
                first = (verdict.metrics.get("first_divergent") or {}).get("first")
                named += first == module
                print(f"planted {engine:<18} expected {module:<18} named {first} ({verdict.status})")
            print(f"planted faults named at their module: {named}/{len(ALL)} = {named / len(ALL):.0%} (goal >= 90%)")
    finally:
        runner.close()
    return 0 if worst_share <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
