"""The bf16 lane's absolute bar (candidate vs the fp32 reference) per row class: dense / MoE, before any update /
after. Reads the whole verdicts a seed scan wrote (`seed_scan.py --verdicts FILE`, clean runs only) and prints, per
class and check, the worst clean value, the limit in force, its margin (limit / worst), and the smallest effect the
limit still detects (limit + worst: an error on top of the worst clean one that crosses it). A relative check's limit
is rtol + atol / |reference| at that run (the atol covers a loss near zero).

    python benchmarks/seed_scan.py --matrix scenarios/cpu.yaml -k bf16 --seeds 16 --verdicts V.jsonl
    python benchmarks/bf16_class_limits.py V.jsonl [W.jsonl ...]

The rows' class is the judge's: MoE where the model has experts (harness/config/models.py model_shape), and the
workload's loss (a GRPO step-1 loss over seeded advantages is mostly their mean; an SFT one is the model's own).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

from parity.harness.config.models import model_shape

#: the checks of the absolute bar, by the metric's start; step-wise ones split at the first update
ABSOLUTE = ("log-prob before training", "log-prob after the last step", "entropy before training",
            "entropy after the last step", "loss rel diff", "pre-clip grad norm rel diff")


def check_class(check: dict) -> str | None:
    """'<metric> [step 1 | steps >= 2]' for a check of the absolute bar, else None."""
    metric = check["metric"]
    if check["lane"] not in ("abs", "rel") or not metric.startswith(ABSOLUTE) or "ratio" in metric:
        return None
    if metric in ("loss rel diff", "pre-clip grad norm rel diff"):  # a step's later updates come after one
        first = check["step"] == 1 and check.get("update") in (None, 1)
        return f"{metric}, {'before any update' if first else 'after updates'}"
    return metric


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verdicts", type=Path, nargs="+")
    args = parser.parse_args()
    worst: dict[tuple[str, str], tuple[float, float, str]] = {}
    runs: dict[str, int] = defaultdict(int)
    for path in args.verdicts:
        for line in path.read_text().splitlines():
            verdict = json.loads(line)
            if verdict["verdict"] != "PASS":
                continue
            model = verdict["id"].split("/")[0]
            shape = model_shape(model)
            loss = ((verdict.get("provenance") or {}).get("workload") or {}).get("loss", "?")
            klass = f"{'MoE' if shape and shape.num_experts else 'dense'}, {loss}"
            runs[klass] += 1
            for check in verdict["checks"]:
                if (name := check_class(check)) is None:
                    continue
                share = check["observed"] / check["limit"]
                key = (klass, name)
                if key not in worst or check["observed"] > worst[key][0]:
                    worst[key] = (check["observed"], share, f"{verdict['id']} seed {verdict.get('seed')}")
    print("clean runs: " + ", ".join(f"{klass} {n}" for klass, n in sorted(runs.items())))
    rows = [(klass, name, f"{observed:.3g}", f"{observed / share:.3g}", f"{1 / share:.1f}x", where)
            for (klass, name), (observed, share, where) in sorted(worst.items())]
    print(tabulate(rows, headers=["class", "check", "worst clean", "limit (at that run)", "margin", "run"],
                   tablefmt="github"))


if __name__ == "__main__":
    main()
