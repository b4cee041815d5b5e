"""The history rule and the perf gate (harness/judge/drift.py) on synthetic histories: 75 scenarios x 20 nights of
step times with log-normal run-to-run noise. Prints, per noise level:

- how often a history of clean scenarios flags any of them: judged once over the 20 nights, and judged every
  night over the nights so far (what a nightly `parity history` shows);
- how often a step in one scenario (+10 % at 2 % noise, +25 % at 5 %) is flagged within 3 nights of it (the
  history cut 3 nights after the step starts), at a random night and at fixed ones;
- a slow creep (+1 % a night) and a regression that undoes an earlier improvement;
- the perf gate (max_slowdown 5 %): false FAILs of a clean run and the share of slowdowns it FAILs, by the number
  of earlier runs of the same provenance;
- noiseless histories (a CPU error metric, bit-identical night after night) and mixed ones (half noiseless, half
  noisy): false flags, and a step in one noiseless series (x2 past the 50 % margin; x1.3 inside it);
- one change across the matrix (drift.matrix_changes): every scenario's step time +15 % on one night, or 60 % of
  them, or +3 % (inside the 5 % margin), and how often a clean history flags one.

    python benchmarks/drift_rule.py [--trials 200] [--noise 0.02 0.05]
"""

from __future__ import annotations

import argparse
import math
import random

from parity.harness.contract.schema import PerfGate
from parity.harness.judge.drift import GATE_MIN, METRICS, flag_changes, matrix_changes, perf_breaches

STEP_TIME = next(m for m in METRICS if m.key == "step_time_s")
LOGPROB = next(m for m in METRICS if m.key == "logprob_max_abs")
SCENARIOS, NIGHTS, DETECT_WITHIN = 75, 20, 3
STEPS = {0.02: 0.10, 0.05: 0.25}
"""Noise level -> the step that must be caught (the issue's acceptance)."""


def history(rng: random.Random, noise: float, scenarios: int = SCENARIOS, nights: int = NIGHTS) -> list[list[float]]:
    """Step times per scenario and night: a base time per scenario times log-normal noise."""
    return [[base * math.exp(rng.gauss(0.0, noise)) for _ in range(nights)]
            for base in (rng.uniform(0.05, 2.0) for _ in range(scenarios))]


def flagged(series: list[list[float]], upto: int | None = None) -> dict[int, list]:
    return flag_changes({i: (values[:upto], STEP_TIME) for i, values in enumerate(series)})


def clean_rates(rng: random.Random, noise: float, trials: int) -> tuple[float, float]:
    """(share of histories with any flag judged once at the end, share with a flag on any night)."""
    once = nightly = 0
    for _ in range(trials):
        series = history(rng, noise)
        once += bool(flagged(series))
        nightly += any(flagged(series, night) for night in range(5, NIGHTS + 1))
    return once / trials, nightly / trials


def step_rate(rng: random.Random, noise: float, step: float, trials: int, at: int | None = None) -> tuple[float, float]:
    """(share of trials whose stepped scenario is flagged at the step (or the 2 nights after) with the history cut
    DETECT_WITHIN nights after it starts, share of those trials that also flag a clean scenario)."""
    hits = false = 0
    for _ in range(trials):
        series = history(rng, noise)
        start = at if at is not None else rng.randint(8, NIGHTS - DETECT_WITHIN)
        series[0] = [v * (1 + step) if i >= start else v for i, v in enumerate(series[0])]
        flags = flagged(series, start + DETECT_WITHIN)
        hits += any(start <= c.index < start + DETECT_WITHIN for c in flags.get(0, []))
        false += any(key != 0 for key in flags)
    return hits / trials, false / trials


def shaped_rate(rng: random.Random, noise: float, trials: int, shape: str) -> float:
    """Creep: +1 % a night from night 0, flagged by night 20. Undo: -10 % from night 5, back from night 12,
    flagged at nights 12-14 with the history cut at night 15."""
    hits = 0
    for _ in range(trials):
        series = history(rng, noise)
        if shape == "creep":
            series[0] = [v * 1.01 ** i for i, v in enumerate(series[0])]
            hits += bool(flagged(series).get(0))
        else:
            series[0] = [v * (0.9 if 5 <= i < 12 else 1.0) for i, v in enumerate(series[0])]
            hits += any(12 <= c.index < 15 for c in flagged(series, 15).get(0, []))
    return hits / trials


def gate_rates(rng: random.Random, noise: float, earlier: int, slowdown: float, trials: int) -> tuple[float, float]:
    """(false FAIL share of a clean run, FAIL share of a run `slowdown` slower), max_slowdown 5 %."""
    gate = PerfGate(max_slowdown=0.05)
    false = caught = 0
    for _ in range(trials):
        past = [{"step_time_s": math.exp(rng.gauss(0.0, noise))} for _ in range(earlier)]
        false += bool(perf_breaches(gate, {"step_time_s": math.exp(rng.gauss(0.0, noise))}, past))
        caught += bool(perf_breaches(gate, {"step_time_s": (1 + slowdown) * math.exp(rng.gauss(0.0, noise))}, past))
    return false / trials, caught / trials


def noiseless_rates(rng: random.Random, trials: int, mixed: bool) -> tuple[float, float, float]:
    """(clean histories with any flag, x2 steps in one noiseless series flagged at their night, x1.3 steps flagged):
    every series noiseless (a log-prob error per scenario), or half of them noisy step times (5 %)."""
    clean = doubled = inside = 0
    for _ in range(trials):
        levels = [2.0 ** -rng.randint(14, 24) for _ in range(SCENARIOS)]
        series = {i: ([level] * NIGHTS, LOGPROB) for i, level in enumerate(levels)}
        if mixed:
            series |= {i: (values, STEP_TIME) for i, values in enumerate(history(rng, 0.05, SCENARIOS // 2))
                       if i % 2}
        at = rng.randint(8, NIGHTS - 1)
        clean += bool(flag_changes(series))
        for factor in (2.0, 1.3):
            values = [v * (factor if i >= at else 1.0) for i, v in enumerate(series[0][0])]
            found = any(c.index == at for c in flag_changes({**series, 0: (values, LOGPROB)}).get(0, []))
            doubled += found and factor == 2.0
            inside += found and factor == 1.3
    return clean / trials, doubled / trials, inside / trials


def matrix_rates(rng: random.Random, noise: float, trials: int) -> dict[str, float]:
    """Share of histories (75 x 20, log-normal noise) with a matrix-wide change flagged: clean (judged once, and
    every night from night 5), every scenario +15 % from the last night, 60 % of them, all +3 %."""
    out = dict.fromkeys(("clean once", "clean nightly", "all +15%", "60% +15%", "all +3%"), 0.0)
    for _ in range(trials):
        series = {i: (values, STEP_TIME) for i, values in enumerate(history(rng, noise))}
        out["clean once"] += bool(matrix_changes(series))
        out["clean nightly"] += any(matrix_changes({k: (v[:night], m) for k, (v, m) in series.items()})
                                    for night in range(5, NIGHTS + 1))
        for label, factor, share in (("all +15%", 1.15, 1.0), ("60% +15%", 1.15, 0.6), ("all +3%", 1.03, 1.0)):
            moved = {k: ([x * (factor if i == NIGHTS - 1 and k < share * SCENARIOS else 1.0)
                          for i, x in enumerate(v)], m) for k, (v, m) in series.items()}
            out[label] += any(c.index == NIGHTS - 1 for c in matrix_changes(moved))
    return {label: count / trials for label, count in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200, help="synthetic histories per figure")
    parser.add_argument("--noise", type=float, nargs="+", default=[0.02, 0.05],
                        help="run-to-run noise: standard deviation of the log step time")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"{SCENARIOS} scenarios x {NIGHTS} nights, {args.trials} synthetic histories per figure")
    for noise in args.noise:
        step = STEPS.get(noise, 5 * noise)
        once, nightly = clean_rates(rng, noise, args.trials)
        print(f"\nnoise {noise:.0%} (log-normal), step {step:.0%}")
        print(f"  {once:6.1%}  clean histories with any flag, judged once over {NIGHTS} nights")
        print(f"  {nightly:6.1%}  clean histories with any flag on any night (judged every night from night 5: "
              f"{1 - (1 - nightly) ** (1 / (NIGHTS - 4)):.1%} of nights)")
        hits, false = step_rate(rng, noise, step, args.trials, NIGHTS - DETECT_WITHIN)
        print(f"  {hits:6.1%}  +{step:.0%} step in one scenario at night {NIGHTS - DETECT_WITHIN + 1} flagged by night "
              f"{NIGHTS} (within {DETECT_WITHIN} nights; {false:.1%} of those histories also flag a clean scenario)")
        hits, _ = step_rate(rng, noise, step, args.trials)
        print(f"  {hits:6.1%}  ... the step at a random night 9-18, flagged within {DETECT_WITHIN} nights")
        for at in (5, 8, 12):
            hits, _ = step_rate(rng, noise, step, args.trials // 2, at)
            print(f"  {hits:6.1%}  ... the step at night {at + 1} (a baseline of {at} nights)")
        print(f"  {shaped_rate(rng, noise, args.trials, 'creep'):6.1%}  +1 %/night creep over {NIGHTS} nights flagged")
        print(f"  {shaped_rate(rng, noise, args.trials, 'undo'):6.1%}  -10 % at night 6 undone at night 13, flagged "
              "by night 15")
        for earlier in (1, GATE_MIN, 5, 20):
            for slowdown in (0.10, 0.25):
                false, caught = gate_rates(rng, noise, earlier, slowdown, args.trials * 5)
                print(f"  gate, {earlier:2d} earlier runs: {false:6.1%} false FAIL, {caught:6.1%} of +{slowdown:.0%} "
                      "slowdowns FAIL (max_slowdown 5 %)")
        rates = matrix_rates(rng, noise, max(1, args.trials // 4))
        print(f"  matrix: {rates['clean once']:6.1%} clean histories flag a matrix change judged once, "
              f"{rates['clean nightly']:6.1%} on any night; a change on the last night flagged in "
              f"{rates['all +15%']:.1%} (every scenario +15 %), {rates['60% +15%']:.1%} (60 % of them), "
              f"{rates['all +3%']:.1%} (all +3 %, inside the 5 % margin)")
    for mixed in (False, True):
        clean, doubled, inside = noiseless_rates(rng, max(1, args.trials // 4), mixed)
        what = "mixed (half noiseless errors, half 5 % noisy step times)" if mixed else "noiseless (every series)"
        print(f"\n{what}: {clean:6.1%} clean histories with any flag; a step in one noiseless series flagged at "
              f"its night: {doubled:.1%} (x2), {inside:.1%} (x1.3, inside the 50 % margin)")


if __name__ == "__main__":
    main()
