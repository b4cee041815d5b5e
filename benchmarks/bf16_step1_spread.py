"""The bf16 three-way rows at step 1, candidate against its same-recipe bf16 baseline (the same weights, the same
recipe, before any update): how far apart the pre-clip grad norm and each module's grad norm are in clean runs,
and what a planted 1 % gradient scale and a x1.5 module gradient move them by. Prints per row class (same code:
the engine runs the baseline's modeling code data-parallel only, dense or MoE; else dense / MoE) the worst clean
relative difference over the rows and seeds run, the planted ones, and the limit a margin over the clean spread
gives (limit = margin x worst clean; the smallest effect it detects = limit + worst clean).

    python benchmarks/bf16_step1_spread.py [--seeds 0 1 2] [--margin 2.5] [-k SUBSTRING]

Small by default (3 seeds: the machine is shared); the rows are scenarios/cpu.yaml's bf16 rows with a baseline.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from parity.harness.config.matrix import load_file
from parity.harness.config.models import model_shape
from parity.harness.contract.schema import Fault
from parity.harness.judge.baseline_step1 import same_code
from parity.harness.judge.reference import baseline_scenario
from parity.harness.options import RunOptions
from parity.harness.run.records import RunRecord
from parity.harness.runner import Runner

REPO = Path(__file__).resolve().parents[1]


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def step1(candidate: RunRecord, baseline: RunRecord) -> tuple[float, dict[str, float]]:
    """(grad-norm rel diff, module -> group grad-norm rel diff) at step 1."""
    c, b = candidate.steps[0], baseline.steps[0]
    groups = {name: rel(value, (b.group_grad_norms or {})[name]) for name, value in (c.group_grad_norms or {}).items()
              if name in (b.group_grad_norms or {})}
    return rel(c.grad_norm, b.grad_norm), groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--margin", type=float, default=2.5)
    parser.add_argument("-k", default="")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".parity-cache")
    args = parser.parse_args()
    rows = [s for s in load_file(REPO / "scenarios" / "cpu.yaml")
            if s.dtype == "bf16" and s.baseline and not s.faults and args.k in s.id]
    out = Path(tempfile.mkdtemp(prefix="bf16-step1-"))
    runner = Runner(RunOptions(out_dir=out, cache_dir=args.cache_dir))
    worst: dict[str, dict[str, float]] = {}
    planted: dict[str, dict[str, float]] = {}
    try:
        for seed in args.seeds:
            for row in rows:
                shape = model_shape(row.model)
                klass = "same code" if same_code(row) else "MoE" if shape and shape.num_experts else "dense"
                one = row.model_copy(update={"workload": row.workload.model_copy(update={"seed": seed, "steps": 1})})
                baseline = runner._cached(baseline_scenario(one), "baseline")
                clean = runner.execute(one, f"{one.id}#s{seed}", out / f"{len(worst)}-{seed}-clean")
                if not (clean.ok and baseline.ok):
                    print(f"{one.id} seed {seed}: {clean.error or baseline.error}")
                    continue
                norm, groups = step1(clean, baseline)
                w = worst.setdefault(klass, {"grad_norm": 0.0, "group": 0.0})
                w["grad_norm"], w["group"] = max(w["grad_norm"], norm), max(w["group"], max(groups.values(), default=0))
                print(f"{one.id} seed {seed}: clean grad norm {norm:.3g}, worst module {max(groups.values()):.3g}",
                      flush=True)
                if seed != args.seeds[0]:
                    continue
                module = sorted(groups)[len(groups) // 2]
                for label, fault in (("grad x1.01", Fault(kind="grad_scale", step=1, factor=1.01)),
                                     (f"{module} x1.5", Fault(kind="module_grad_scale", step=1, factor=1.5,
                                                              key=module))):
                    faulted = one.model_copy(update={"faults": (fault,)})
                    record = runner.execute(faulted, f"{faulted.id}#s{seed}", out / f"{label}-{seed}")
                    f_norm, f_groups = step1(record, baseline)
                    p = planted.setdefault(klass, {})
                    p[f"{label.split(' ')[-1]} grad norm"] = min(p.get(f"{label.split(' ')[-1]} grad norm", math.inf),
                                                                 f_norm)
                    p[f"{label.split(' ')[-1]} module"] = min(p.get(f"{label.split(' ')[-1]} module", math.inf),
                                                              f_groups.get(module, math.nan))
                    moved = f_groups.get(module, math.nan)
                    print(f"  planted {label}: grad norm {f_norm:.3g}, that module {moved:.3g}", flush=True)
    finally:
        runner.close()
    print(f"\nstep 1, candidate vs its same-recipe bf16 baseline, seeds {args.seeds}, margin x{args.margin:g}")
    print("| class | check | worst clean | limit | smallest effect detected | planted |\n|---|---|---|---|---|---|")
    for klass, w in worst.items():
        p = planted.get(klass, {})
        for check, key, fault in (("pre-clip grad norm rel", "grad_norm", "x1.01 grad norm"),
                                  ("module grad norm rel", "group", "x1.5 module")):
            limit = args.margin * w[key]
            print(f"| {klass} | {check} | {w[key]:.3g} | {limit:.3g} | {limit + w[key]:.3g} | "
                  f"{fault}: {p.get(fault, math.nan):.3g} |")


if __name__ == "__main__":
    main()
