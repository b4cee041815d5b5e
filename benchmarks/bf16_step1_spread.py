"""The bf16 three-way rows at step 1, candidate against its same-recipe bf16 baseline (the same weights, the same
recipe, before any update): how far apart the loss, the pre-clip grad norm and each module's grad norm are in clean
runs, and what a planted 1 % loss scale, 1 % gradient scale and x1.5 module gradient move them by. Prints per row
class (same code: the engine runs the baseline's modeling code data-parallel only, dense or MoE; else dense / MoE)
the worst clean relative difference over the rows and seeds run, the planted ones, and the limit a margin over the
clean spread gives (limit = margin x worst clean; the smallest effect it detects = limit + worst clean).

    python benchmarks/bf16_step1_spread.py [--seeds 0 1 2] [--margin 2.5] [-k SUBSTRING] [--matrix FILE]

Small by default (3 seeds: the machine is shared); the rows are the matrix's (scenarios/cpu.yaml's) bf16 rows with a
baseline.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from parity.harness.config.matrix import load_file
from parity.harness.config.models import model_shape
from parity.harness.contract.schema import Fault
from parity.harness.judge.baseline_step1 import common_grad_scale
from parity.harness.judge.reference import baseline_scenario
from parity.harness.judge.row_class import same_code
from parity.harness.options import RunOptions
from parity.harness.run.records import RunRecord
from parity.harness.runner import Runner

REPO = Path(__file__).resolve().parents[1]


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


#: the checks measured: name -> what it is called in the table
CHECKS = {"loss": "loss rel", "grad_norm": "pre-clip grad norm rel", "module": "module grad norm rel",
          "common": "median module ratio - 1"}


def step1(candidate: RunRecord, baseline: RunRecord, module: str | None = None) -> dict[str, float]:
    """At step 1: the loss and pre-clip grad norm rel diffs, and the worst module's (or `module`'s)."""
    c, b = candidate.steps[0], baseline.steps[0]
    base_groups = b.group_grad_norms or {}
    groups = {name: rel(value, base_groups[name]) for name, value in (c.group_grad_norms or {}).items()
              if name in base_groups}
    moved = groups.get(module, math.nan) if module else max(groups.values(), default=0.0)
    common = common_grad_scale(c.group_grad_norms or {}, base_groups)
    return {"loss": rel(c.loss, b.loss), "grad_norm": rel(c.grad_norm, b.grad_norm), "module": moved,
            "common": math.nan if common is None else abs(common)}

#: check -> the planted fault that must move it
TARGET = {"loss": "loss x1.01", "grad_norm": "grad x1.01", "module": "module x1.5", "common": "grad x1.01"}


def planted_faults(module: str) -> dict[str, tuple[Fault, str]]:
    """label -> (the fault, the check it must move): 1 % on the loss (its token normaliser 1 % short), 1 % on every
    gradient, one module's gradient x1.5."""
    return {"loss x1.01": (Fault(kind="loss_normalizer_scale", factor=1 / 1.01), "loss"),
            "grad x1.01": (Fault(kind="grad_scale", step=1, factor=1.01), "grad_norm"),
            "module x1.5": (Fault(kind="module_grad_scale", step=1, factor=1.5, key=module), "module")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--margin", type=float, default=2.5)
    parser.add_argument("-k", default="")
    parser.add_argument("--matrix", type=Path, default=REPO / "scenarios" / "cpu.yaml",
                        help="the matrix file whose bf16 rows with a baseline are run (verl's need the verl lane)")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".parity-cache")
    args = parser.parse_args()
    rows = [s for s in load_file(args.matrix)
            if s.dtype == "bf16" and s.baseline and not s.faults and args.k in s.id]
    out = Path(tempfile.mkdtemp(prefix="bf16-step1-"))
    runner = Runner(RunOptions(out_dir=out, cache_dir=args.cache_dir))
    worst: dict[str, dict[str, float]] = {}
    planted: dict[str, dict[str, float]] = {}
    try:
        for seed in args.seeds:
            for n, row in enumerate(rows):
                shape = model_shape(row.model)
                klass = "same code" if same_code(row) else "MoE" if shape and shape.num_experts else "dense"
                one = row.model_copy(update={"workload": row.workload.model_copy(update={"seed": seed, "steps": 1})})
                baseline = runner._cached(baseline_scenario(one), "baseline")
                clean = runner.execute(one, f"{one.id}#s{seed}", out / f"{n}-{seed}-clean")
                if not (clean.ok and baseline.ok):
                    print(f"{one.id} seed {seed}: {clean.error or baseline.error}")
                    continue
                found = step1(clean, baseline)
                w = worst.setdefault(klass, dict.fromkeys(CHECKS, 0.0))
                for check, value in found.items():
                    w[check] = max(w[check], value)
                print(f"{one.id} seed {seed}: clean " + ", ".join(f"{CHECKS[c]} {v:.3g}" for c, v in found.items()),
                      flush=True)
                if seed != args.seeds[0]:
                    continue
                modules = sorted(clean.steps[0].group_grad_norms or {"": 0.0})
                module = modules[len(modules) // 2]
                for label, (fault, check) in planted_faults(module).items():
                    faulted = one.model_copy(update={"faults": (fault,)})
                    record = runner.execute(faulted, f"{faulted.id}#s{seed}", out / f"{n}-{label}-{seed}")
                    found = step1(record, baseline, module)
                    same = [(s.loss, s.grad_norm, s.group_grad_norms) for s in (record.steps[0], clean.steps[0])]
                    if same[0] == same[1]:  # bit-identical to the clean run: the engine never applied the fault
                        print(f"  planted {label}: not applied by {one.strategy} (its step 1 is the clean one's)")
                        continue
                    p = planted.setdefault(klass, {})
                    for target in (c for c, fault_label in TARGET.items() if fault_label == label):
                        p[target] = min(p.get(target, math.inf), found[target])
                    print(f"  planted {label if check != 'module' else module + ' x1.5'}: "
                          + ", ".join(f"{CHECKS[c]} {found[c]:.3g}" for c in TARGET if TARGET[c] == label), flush=True)
    finally:
        runner.close()
    print(f"\nstep 1, candidate vs its same-recipe bf16 baseline, seeds {args.seeds}, margin x{args.margin:g}")
    print("| class | check | worst clean | limit | smallest effect detected | planted (least moved) |\n"
          "|---|---|---|---|---|---|")
    for klass, w in worst.items():
        p = planted.get(klass, {})
        for check, label in TARGET.items():
            limit = args.margin * w[check]
            print(f"| {klass} | {CHECKS[check]} | {w[check]:.3g} | {limit:.3g} | {limit + w[check]:.3g} | "
                  f"{label}: {p.get(check, math.nan):.3g} |")


if __name__ == "__main__":
    main()
