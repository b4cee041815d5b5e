"""Margins of every checked metric from runs on disk: for each metric family, limit ÷ worst clean (how far the
worst clean scenario sits below its limit) and smallest fault ÷ limit (how far the mildest injected fault that
trips this family sits above it), from results.jsonl files (`parity run` out dirs).

Clean = a scenario without faults that PASSed; faulted = one that FAILed (a planted defect: a fault kind, or a
defect written into the scenario such as an engine ignoring `dtype`). Run the default matrix for the clean side
(benchmarks/false_fail_load.py counts its false FAILs) and tests/data/faults.yaml for the faulted side. Ratios
are taken per check (observed / limit), so limits that vary by step (atol / |ref|) are honoured; families are
split by dtype (the fp32 and bf16 lanes have different limits). The bf16 / fp16 lower bound is a floor,
so there the margins are worst clean ÷ bound and bound ÷ the faulted (fp32-computed) value.

    python benchmarks/margins.py OUT_DIR_OR_RESULTS_JSONL ...
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from check_families import checks_by_family, results

from parity.harness.judge.tolerances import DEFAULTS

LOWER_BOUND = "log-prob before training max |Δ| lower bound (bf16/fp16)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args()
    clean: dict[str, float] = {}  # family -> worst observed / limit over clean scenarios
    fault: dict[str, tuple[float, str]] = {}  # family -> (smallest observed / limit over failing faults, id)
    counts = {"clean": 0, "faulted": 0}
    for result in results(args.paths):
        if result["verdict"] not in ("PASS", "FAIL"):
            continue
        # a FAIL without a fault kind is a planted defect too (an fsdp_kwargs override, an engine ignoring dtype)
        faulted = bool(result.get("faults")) or result["verdict"] == "FAIL"
        counts["faulted" if faulted else "clean"] += 1
        families = checks_by_family(result)
        bound = DEFAULTS[result.get("dtype", "fp32")].logprob_max_abs_min
        if bound and "logprobs_before" in result.get("metrics", {}):
            families[LOWER_BOUND] = [(bound, result["metrics"]["logprobs_before"]["max_abs"])]  # floor: inverted
        for family, pairs in families.items():
            name = f"{family} [{result.get('dtype', 'fp32')}]"
            # a limit of 0 (an exact check: expert loads) passes only at 0 and is infinitely exceeded otherwise
            worst = max((obs / lim if lim > 0 else (0.0 if obs == 0 else math.inf) for obs, lim in pairs),
                        key=lambda v: math.inf if math.isnan(v) else v)
            if not faulted:
                clean[name] = max(clean.get(name, 0.0), worst)
            elif result["verdict"] == "FAIL" and not worst <= 1.0 and (name not in fault or worst < fault[name][0]):
                fault[name] = (worst, result["id"])
    print(f"{counts['clean']} clean, {counts['faulted']} faulted scenarios from {len(args.paths)} path(s)\n")
    print("| metric family [dtype] | limit ÷ worst clean | smallest fault ÷ limit | (fault) |\n|---|---|---|---|")
    for name in sorted(set(clean) | set(fault)):
        head = f"{1 / clean[name]:.3g}" if clean.get(name) else ("∞" if name in clean else "–")
        tail, which = fault.get(name, (None, ""))
        print(f"| {name} | {head} | {f'{tail:.3g}' if tail is not None else '–'} | {which} |")


if __name__ == "__main__":
    main()
