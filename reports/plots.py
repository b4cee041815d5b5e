"""matplotlib figures for the HTML report, returned as base64 PNG so the page is one self-contained file.

Every figure reads only verdict JSON (results.jsonl): the per-step series and the |Δ log-prob| histogram the
judge stores in `metrics`, and the metrics of earlier runs for trends.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import os
import subprocess
import sys
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: CI runners and ranks have none
import matplotlib.pyplot as plt  # after the backend is chosen
from matplotlib.ticker import MaxNLocator

DPI = 144
"""Twice the CSS pixel density the page shows a figure at (html.FIGURE_CSS_WIDTH_PX): sharp on a HiDPI screen."""
CANDIDATE, REFERENCE = "#1f77b4", "#ff7f0e"
FIGURE_WIDTH_IN = 13.0
"""The scenario figure's width: shown at FIGURE_WIDTH_IN x 96 CSS px, its text is at least LEGEND_PT x 4/3 px."""
LEGEND_PT = 8
RESUMED = "#7f7f7f"


def resumed_after(result: dict[str, Any]) -> int | None:
    """The step after which a resumed run's second part took over (harness/run/staged.py records it)."""
    resumed = (result.get("provenance") or {}).get("resumed") or {}
    step = resumed.get("after_step")
    return int(step) if isinstance(step, int | float) else None


def _mark_resume(axes: Any, result: dict[str, Any]) -> None:
    """A dashed vertical line between the step the checkpoint was saved after and the first resumed step."""
    if (step := resumed_after(result)) is None:
        return
    for ax in axes:
        ax.axvline(step + 0.5, color=RESUMED, linestyle="-.", linewidth=1.2, label=f"resumed after step {step}")
        ax.legend(fontsize=LEGEND_PT)


def _png(fig: Any, close: bool = True) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)  # fixed margins: tight bboxes cost a layout pass each
    if close:
        plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


class _ScenarioCanvas:
    """The 1 x 5 scenario figure, built once per process and redrawn for each result: building the axes and their
    ticks is a good part of drawing a figure (a page draws one per scenario). Panels: loss and pre-clip grad norm
    per step (candidate, reference); their relative differences per step against each step's limit (the band a long
    run's limits widen by); the learning rate the engine's optimizer ran at against the schedule; the per-token
    |Δ log-prob| histogram."""

    TITLES = ("loss", "pre-clip grad norm", "rel diff vs its limit (band)", "learning rate",
              "per-token |Δ log-prob| vs reference")

    def __init__(self) -> None:
        self.fig, self.axes = plt.subplots(1, 5, figsize=(FIGURE_WIDTH_IN, 3.0))
        for ax, title in zip(self.axes, self.TITLES, strict=True):
            ax.set_title(title, fontsize=10, y=1.0)  # a fixed y skips a tight-bbox pass per axes
        for ax in self.axes[:4]:
            ax.set_xlabel("optimizer update")  # one per step, or mini_batches x ppo_epochs per step (RL rows)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        self.axes[2].set_yscale("log")
        self.axes[4].set_xlabel("log10 |Δ|")
        self.axes[4].set_ylabel("tokens")
        self.fig.subplots_adjust(left=0.04, right=0.995, bottom=0.17, top=0.9, wspace=0.28)

    def draw(self, series: dict[str, Any] | None, metrics: dict[str, Any], result: dict[str, Any]) -> str:
        for ax in self.axes:  # what the previous result drew
            for artist in [*ax.lines, *ax.patches, *ax.collections]:
                artist.remove()
            if (legend := ax.get_legend()) is not None:
                legend.remove()
        candidate_label = result.get("strategy", "candidate")
        if series:
            style = {"marker": "o" if len(series["loss"]) <= 20 else None, "markersize": 3}
            for ax, key in ((self.axes[0], "loss"), (self.axes[1], "grad_norm")):
                steps = range(1, len(series[key]) + 1)
                ax.plot(steps, series[key], "-", color=CANDIDATE, label=candidate_label, **style)
                ax.plot(range(1, len(series[f"reference_{key}"]) + 1), series[f"reference_{key}"], "--",
                        color=REFERENCE, label=(result.get("reference") or "reference").split(":", 1)[0])
                ax.legend(fontsize=LEGEND_PT)
            _band(self.axes[2], metrics)
            _learning_rate(self.axes[3], series, candidate_label)
            _mark_resume(self.axes[:4], result)
        _histogram(self.axes[4], metrics.get("logprob_abs_hist"))
        for ax in self.axes:
            if ax.lines or ax.patches or ax.collections:
                ax.relim()
                ax.autoscale_view()
            else:  # an empty panel shows what a new axes shows, not the previous result's limits
                ax.set_xlim(0, 1)
                ax.set_ylim(*((1e-8, 1) if ax.get_yscale() == "log" else (0, 1)))
                ax.set_autoscale_on(True)
        return _png(self.fig, close=False)


#: a relative difference of 0 (bit-identical) drawn on the log axis at this floor
BAND_FLOOR = 1e-10


#: the band panel's colours (not the candidate / reference pair of the other panels)
BAND_COLORS = {"loss": "#2ca02c", "grad_norm": "#d62728"}


def _floored(values: list[Any]) -> list[float]:
    """For the log axis: bit-identical (0) at BAND_FLOOR, missing or non-finite at 1 (off any limit)."""
    return [max(v, BAND_FLOOR) if isinstance(v, int | float) and math.isfinite(v) else 1.0 for v in values]


def _band(ax: Any, metrics: dict[str, Any]) -> None:
    """Each step's relative difference of loss and grad norm (solid) under its limit (dotted: the band), and the
    low-precision baseline's (thin) where the row has one."""
    for key, color in BAND_COLORS.items():
        values, limits = metrics.get(f"{key}_rel"), metrics.get(f"{key}_rel_limit")
        if not values:
            continue
        name = key.replace("_", " ")
        ax.plot(range(1, len(values) + 1), _floored(values), "-", color=color, label=name)
        if limits:
            ax.plot(range(1, len(limits) + 1), limits, ":", color=color, label=f"{name} limit")
        if baseline := metrics.get(f"{key}_rel_baseline"):
            ax.plot(range(1, len(baseline) + 1), _floored(baseline), "-", color=color, alpha=0.35, linewidth=0.8,
                    label=f"{name} baseline")
    if ax.lines:
        ax.legend(fontsize=LEGEND_PT)


def _learning_rate(ax: Any, series: dict[str, Any], label: str) -> None:
    lrs, schedule = series.get("lr") or [], series.get("schedule_lr") or []
    if any(v is not None for v in lrs):
        ax.plot(range(1, len(lrs) + 1), [math.nan if v is None else v for v in lrs], "-", color=CANDIDATE,
                label=label)
        ax.plot(range(1, len(schedule) + 1), schedule, "--", color=REFERENCE, label="schedule")
        ax.legend(fontsize=LEGEND_PT)


_canvas: _ScenarioCanvas | None = None


def scenario_figure(result: dict[str, Any]) -> str | None:
    """Per-step loss and pre-clip grad norm (candidate vs reference), their differences against each step's limit,
    the learning rate against the schedule, and the per-token |Δ log-prob| histogram before / after training; None
    when the result holds none of them (SKIP, ERROR)."""
    global _canvas
    metrics = result.get("metrics") or {}
    series, hist = metrics.get("series"), metrics.get("logprob_abs_hist")
    if not series and not hist:
        return None
    if _canvas is None:
        _canvas = _ScenarioCanvas()
    return _canvas.draw(series, metrics, result)


def _histogram(ax: Any, hist: dict[str, Any] | None) -> None:
    if not hist:
        return
    edges = hist["edges"]
    centers = [math.log10(e) for e in edges[:-1]]
    width = math.log10(edges[1]) - math.log10(edges[0])
    for phase, color, label in (("logprobs_before", CANDIDATE, "before"), ("logprobs_after", REFERENCE, "after")):
        ax.stairs(hist[phase]["counts"], [*centers, centers[-1] + width], fill=True, alpha=0.55, color=color,
                  label=f"{label} (exact/below: {hist[phase]['below']}, above/non-finite: {hist[phase]['above']})")
    ax.legend(fontsize=LEGEND_PT)


def trend_figure(run_id: str, labels: list[str], series: dict[str, list[float | None]],
                 flagged: dict[str, int]) -> str:
    """One panel per metric over earlier runs; a red marker at the run where a change was flagged."""
    names = [name for name, values in series.items() if any(v is not None for v in values)]
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(2.6 * max(len(names), 1) + 0.5, 2.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=False):
        xs = [i for i, v in enumerate(series[name]) if v is not None]
        ax.plot(xs, [series[name][i] for i in xs], "o-", color=CANDIDATE, markersize=3)
        if name in flagged:
            ax.plot([flagged[name]], [series[name][flagged[name]]], "o", color="red", markersize=7)
        ax.set_title(name, fontsize=8, y=1.0)
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=6)
    fig.suptitle(run_id, fontsize=8)
    fig.subplots_adjust(bottom=0.35, top=0.8, wspace=0.35)
    return _png(fig)


#: below this many figures a worker process costs more (its own matplotlib import) than it saves
PARALLEL_MIN = 12


def scenario_figures(results: list[dict[str, Any]], workers: int | None = None) -> list[str | None]:
    """`scenario_figure` of every result, in order. Many figures are drawn by worker processes (one per CPU, at
    most 8): text layout dominates a figure, so a page of the default matrix is slow in one process. The workers
    are plain `python -m parity.reports.plots` subprocesses fed JSON (no multiprocessing: it would re-import the
    caller's __main__); a worker that fails leaves its share to this process."""
    workers = min(workers or os.cpu_count() or 1, 8, max(1, len(results) // (PARALLEL_MIN // 2)))
    if workers < 2 or len(results) < PARALLEL_MIN:
        return [scenario_figure(result) for result in results]
    shares = [list(range(i, len(results), workers)) for i in range(workers)]
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "parity.reports.plots"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for _ in shares]
    except OSError:
        return [scenario_figure(result) for result in results]
    for proc, share in zip(procs, shares, strict=True):
        # a worker reads all of its input before it writes, so writing every input first cannot deadlock
        with contextlib.suppress(OSError):  # BrokenPipeError: that worker died; its share is drawn here
            proc.stdin.write(json.dumps([results[i] for i in share], default=str).encode())
            proc.stdin.close()
    figures: list[str | None] = [None] * len(results)
    for proc, share in zip(procs, shares, strict=True):
        drawn = _drawn(proc, len(share))
        for position, index in enumerate(share):
            figures[index] = drawn[position] if drawn is not None else scenario_figure(results[index])
    return figures


def _drawn(proc: subprocess.Popen[bytes], expected: int) -> list[str | None] | None:
    """A worker's figures, or None when it failed or returned something else."""
    try:
        drawn = json.loads(proc.stdout.read() or b"null")
    except ValueError:
        drawn = None
    ok = proc.wait() == 0 and isinstance(drawn, list) and len(drawn) == expected
    return drawn if ok else None


def _stream(path: str) -> None:
    """The worker of reports/early_figures.py: one JSON result per stdin line as the run records it, one figure per
    line of `path`, flushed, at the lowest CPU priority (it draws in the time the run leaves idle)."""
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no os.nice here
        os.nice(19)
    with open(path, "w") as out:
        for line in sys.stdin:
            out.write(json.dumps(scenario_figure(json.loads(line))) + "\n")
            out.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--stream"]:
        _stream(sys.argv[2])
    else:  # a worker of scenario_figures: JSON results on stdin, their figures on stdout
        sys.stdout.write(json.dumps([scenario_figure(result) for result in json.load(sys.stdin)]))
