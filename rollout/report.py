"""The rollout lane's results: results.jsonl (one verdict per line, every figure) and summary.md (the table)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

#: (column, check, figure) of the table
COLUMNS = (
    ("Δlogp r/t max", "rollout_vs_trainer", "logprob_max_abs"),
    ("Δprob max", "rollout_vs_trainer", "training/rollout_probs_diff_max"),
    ("Δprob mean", "rollout_vs_trainer", "training/rollout_probs_diff_mean"),
    ("Δprob std", "rollout_vs_trainer", "training/rollout_probs_diff_std"),
    ("pearson", "rollout_vs_trainer", "training/rollout_actor_probs_pearson_corr"),
    ("IS mean", "rollout_vs_trainer", "rollout_is_mean"),
    ("IS min", "rollout_vs_trainer", "rollout_is_min"),
    ("IS max", "rollout_vs_trainer", "rollout_is_max"),
    ("Δlogp sampled", "sampled_logprobs", "max"),
    ("Δlogp sync max", "weight_sync", "logprob_max_abs"),
    ("trained Δ", "training_moved", "max"),
)


def rows_of(verdicts: Sequence[Any]) -> list[list[Any]]:
    table = []
    for verdict in sorted(verdicts, key=lambda v: (v.status == "PASS", v.id)):
        cells = [verdict.id]
        for _, check, figure in COLUMNS:
            value = verdict.figures.get(check, {}).get(figure)
            cells.append("" if value is None else f"{value:.3g}")
        table.append([*cells, verdict.status])
    return table


def render(verdicts: Sequence[Any], fmt: str = "simple") -> str:
    headers = ["id", *(c for c, _, _ in COLUMNS), "verdict"]
    return tabulate(rows_of(verdicts), headers=headers, tablefmt=fmt, disable_numparse=True)


def write(out: Path, verdicts: Sequence[Any]) -> None:
    with open(out / "results.jsonl", "w") as handle:
        for verdict in verdicts:
            handle.write(json.dumps(verdict.to_json()) + "\n")
    reasons = [f"- **{v.status}** `{v.id}`: " + "; ".join(r.splitlines()[0] for r in v.reasons if r)
               for v in verdicts if v.reasons]
    (out / "summary.md").write_text("## Rollout ↔ trainer parity\n\n" + render(verdicts, "github") + "\n\n"
                                    + "\n".join(reasons) + "\n")


#: the checks whose clean spread sets the limits (rollout/judge.py), and the figure each is judged on
SPREAD = (("rollout_vs_trainer", "logprob_max_abs"), ("sampled_logprobs", "max"), ("weight_sync", "logprob_max_abs"))


def spread(verdicts: Sequence[Any]) -> dict[str, dict[str, float]]:
    """dtype -> check -> the largest max |Δ log-prob| over the rows without planted faults (broken rows aside)."""
    out: dict[str, dict[str, float]] = {}
    for verdict in verdicts:
        if verdict.info.get("faults") or verdict.info.get("broken") or not verdict.figures:
            continue
        per_dtype = out.setdefault(verdict.info["dtype"], {})
        for check, figure in SPREAD:
            per_dtype[check] = max(per_dtype.get(check, 0.0), verdict.figures[check][figure])
    return out


def render_spread(verdicts: Sequence[Any]) -> str:
    return "\n".join(f"clean spread {dtype}: " + ", ".join(f"{check} {value:.3g}" for check, value in checks.items())
                     for dtype, checks in spread(verdicts).items())
