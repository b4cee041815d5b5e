"""What a reviewer triages with: reasons in causal order with per-module lines collapsed, lists cut with "… N more",
an ERROR's first-dying rank's log (noise trimmed, path named) in every output, the provenance block and what changed
since the previous night (`parity report --history`), the bisection search, and a small all-PASS page."""

from __future__ import annotations

import io
import json

from parity.harness.bisect import search
from parity.harness.judge.causal import causal_reasons
from parity.harness.judge.checks import Check
from parity.reports import html, markdown
from parity.reports import results as results_file
from parity.reports.provenance import Night, changed, night, provenance
from parity.reports.terminal import print_report
from parity.reports.triage import first_rank_log
from tests.conftest import run_cli
from tests.unit.report_pages import night as default_night
from tests.unit.report_pages import result


def _rank_loss_scaled() -> tuple[list[Check], list[Check]]:
    """A loss scaled on one rank, as the judge collects its checks: log-probs first, then loss and grad norm per
    step, then per-module grad norms, then the learning rate. The root cause is the grad norm at step 1."""
    logprobs = [Check("log-prob after the last step max |Δ|", 0.3, 5e-5)]
    steps = [Check("loss rel diff", 1e-8, 5e-5, step=1), Check("pre-clip grad norm rel diff", 0.5, 5e-5, step=1),
             Check("loss rel diff", 0.2, 5e-5, step=2), Check("pre-clip grad norm rel diff", 0.4, 5e-5, step=2)]
    modules = [Check(f"layer {i} mlp grad norm rel diff", 0.5 + i / 100, 1e-4, step=s) for s in (1, 2)
               for i in range(34)]
    lr = [Check("learning rate vs the schedule", 0.1, 1e-6, step=1)]
    return logprobs + steps + modules + lr, modules


def test_reasons_come_in_causal_order_with_modules_collapsed():
    checks, modules = _rank_loss_scaled()
    reasons = causal_reasons(checks, steps=2, per_module=modules)
    assert reasons[0].startswith("pre-clip grad norm rel diff at step 1"), reasons
    assert reasons[1].startswith("34 modules at step 1: rel 0.5 to 0.83"), reasons
    assert reasons[2].startswith("learning rate vs the schedule at step 1"), reasons
    assert reasons[3].startswith("loss rel diff at step 2") and reasons[-1].startswith("log-prob after"), reasons
    assert len(reasons) == 7
    old = [c.reason() for c in checks if not c.passed]  # the defect: check order, every module a line
    assert old[0].startswith("log-prob after") and len(old) == 73


def test_a_few_module_lines_stay_lines():
    few = [Check(f"layer {i} mlp grad norm rel diff", 0.5, 1e-4, step=1) for i in range(2)]
    assert causal_reasons(few, 2, per_module=few) == [c.reason() for c in few]


TAIL = """--- parity-out/records/tiny-llama__fsdp2__dp2__fp32__cpu/rank1.log
Traceback (most recent call last):
  File "engine.py", line 12, in train_step
RuntimeError: shape mismatch in the planted engine
[E1203 gloo/transport/tcp/pair.cc:534] Connection reset by peer [127.0.0.1]:41234 GLHF
[W ProcessGroupGloo.cpp:123] Application timeout caused pair closure
--- parity-out/records/tiny-llama__fsdp2__dp2__fp32__cpu/rank0.log
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer GLHF
"""


def _error_row(tail: str = TAIL) -> dict:
    return {"id": "tiny-llama/fsdp2/dp2/fp32/cpu", "verdict": "ERROR", "log_tail": tail,
            "reasons": ["candidate run error: rank 1 died first: RuntimeError: shape mismatch"]}


def test_an_error_shows_the_first_dying_ranks_log_without_collective_noise_in_every_output(tmp_path):
    log = first_rank_log(_error_row())
    assert log.path.endswith("records/tiny-llama__fsdp2__dp2__fp32__cpu/rank1.log") and log.trimmed == 2
    assert log.lines[-1] == "RuntimeError: shape mismatch in the planted engine"
    rows = [_error_row(), result("tiny-qwen3/fsdp2/dp2/fp32/cpu")]
    terminal = io.StringIO()
    print_report(rows, stream=terminal)
    page = html.render(rows, figures=[None, None])
    for text in (terminal.getvalue(), markdown.render(rows), page):
        assert "records/tiny-llama__fsdp2__dp2__fp32__cpu/rank1.log" in text
        assert "RuntimeError: shape mismatch in the planted engine" in text
        assert "GLHF" not in text and "rank0.log" not in text


def test_a_tail_without_noise_is_kept_whole():
    clean = "--- out/records/x/rank0.log\nValueError: bad output\nline two\n"
    log = first_rank_log(_error_row(clean))
    assert log.trimmed == 0 and log.lines == ["ValueError: bad output", "line two"]


def test_cut_lists_say_how_many_more():
    row = result("tiny-qwen3/fsdp2/dp2/fp32/cpu", "FAIL") | {"reasons": [f"reason {i}" for i in range(12)]}
    terminal = io.StringIO()
    print_report([row], stream=terminal)
    for text in (terminal.getvalue(), markdown.render([row])):
        assert "reason 7" in text and "reason 8" not in text and "… 4 more" in text


def _night(commit: str, torch: str, verl_commit: str, started: str, verdict: str = "PASS") -> list[dict]:
    provenance = {"harness_commit": commit, "started": started, "device_name": "Ascend910B3",
                  "image": "ascend/verl:8.1", "versions": {"torch": torch, "transformers": "5.24.0"},
                  "verl": {"version": "0.10.0.dev", "commit": verl_commit, "source": "/src/verl"}}
    return [result("tiny-qwen3/verl_fsdp/dp2/fp32/cpu", verdict) | {"provenance": provenance},
            result("tiny-qwen3/megatron/tp2/fp32/cpu") | {"provenance": provenance}]


def test_provenance_names_versions_and_what_changed_since_the_previous_night(tmp_path):
    before = _night("aaa1111", "2.12.0", "1dda039b9c", "2026-12-02T02:00:00+00:00")
    now = _night("bbb2222", "2.13.0", "77e0f1d2aa", "2026-12-03T02:00:00+00:00", "FAIL")
    tonight = night(now)
    assert tonight.commit == "bbb2222" and tonight.packages["verl"] == "0.10.0.dev @ 77e0f1d2aa"
    assert tonight.devices == "Ascend910B3" and tonight.images == "ascend/verl:8.1" and tonight.date == "2026-12-03"
    assert changed(night(before), tonight) == ["commit aaa1111 -> bbb2222", "torch 2.12.0 -> 2.13.0",
                                               "verl 0.10.0.dev @ 1dda039b9c -> 0.10.0.dev @ 77e0f1d2aa"]
    assert changed(tonight, tonight) == []  # the clean twin
    for name, rows in (("prev", before), ("now", now)):
        for row in rows:
            results_file.append(tmp_path / name, row)
    done = run_cli("report", str(tmp_path / "now"), "--out", str(tmp_path / "report"), "--history",
                   str(tmp_path / "prev"))
    assert done.returncode == 1, done.stderr  # a FAIL
    summary = (tmp_path / "report" / "summary.md").read_text()
    for text in (summary, done.stdout):
        assert "since the previous night, 2026-12-02 at commit aaa1111 (prev)" in text
        assert "changed: torch 2.12.0 -> 2.13.0" in text and "PASS -> FAIL: tiny-qwen3/verl_fsdp/dp2/fp32/cpu" in text
    assert summary.index("since the previous night") < summary.index("### Not passing")
    gone = run_cli("report", str(tmp_path / "now"), "--out", str(tmp_path / "r2"), "--history", str(tmp_path / "x"))
    assert gone.returncode == 2 and f"--history {tmp_path / 'x'}: no results.jsonl" in gone.stderr


def test_a_night_without_history_states_its_provenance_only():
    block = provenance(_night("c", "2.13.0", "77e0f1d2aa", "2026-12-03T02:00:00+00:00"))
    assert block.previous is None and block.lines()[0].startswith("commit c  device Ascend910B3")
    assert Night("x").lines()[1].startswith("versions: torch -, transformers -, megatron-core -")


def test_the_search_finds_the_first_bad_commit_and_goes_around_ones_that_cannot_say():
    commits = [f"c{i}" for i in range(9)]  # c5 broke it
    asked: list[str] = []

    def verdict(first_bad: int, unknown: tuple[str, ...] = ()):
        def of(commit: str) -> str:
            asked.append(commit)
            return "ERROR" if commit in unknown else ("FAIL" if int(commit[1:]) >= first_bad else "PASS")
        return of

    assert search(commits, verdict(5)) == (5, []) and len(asked) <= 4
    assert search(commits, verdict(5, ("c6", "c7"))) == (5, [])  # around them: c4 PASS, c5 FAIL decide it
    assert search(commits, verdict(5, ("c4",))) == (None, [4, 5])  # c4 cannot say: it or c5
    assert search(commits, verdict(0)) == (0, [])


def test_an_all_pass_night_is_a_small_page_with_pass_rows_folded(tmp_path):
    from parity.reports import plots

    rows = [r for r in default_night() if r["verdict"] == "PASS"]
    figure = plots.scenario_figure(rows[0])
    side: dict[str, bytes] = {}
    page = html.render(rows, figures=[figure] * len(rows), side_files=side)
    path = html.write(tmp_path, page, side)
    assert path.stat().st_size <= 1_000_000, path.stat().st_size
    assert len(side) == len(rows) and all((tmp_path / name).is_file() for name in side)
    assert page.count("<details><summary>PASS ") == len(rows) and 'loading="lazy"' in page
    inline = html.render(rows, figures=[figure] * len(rows))  # the defect: every figure in the page
    assert len(inline.encode()) > 1_000_000


def test_a_failing_row_is_open_with_its_figure_in_the_page():
    rows = [result("tiny-qwen3/fsdp2/dp2/fp32/cpu", "FAIL"), result("tiny-qwen3/megatron/tp2/fp32/cpu")]
    side: dict[str, bytes] = {}
    page = html.render(rows, figures=["AAAA", "BBBB"], side_files=side)
    section = page[page.index('<section id="s-tiny-qwen3-fsdp2-dp2-fp32-cpu"'):]
    assert section.startswith('<section id="s-tiny-qwen3-fsdp2-dp2-fp32-cpu" data-id="tiny-qwen3/fsdp2/dp2/fp32/cpu"'
                              ' class="FAIL">\n<h3>') and "data:image/png;base64,AAAA" in section
    assert list(side) == ["figures/s-tiny-qwen3-megatron-tp2-fp32-cpu.png"]


def test_bisect_json_reaches_the_row(tmp_path):
    from parity.reports.publish import with_bisections

    (tmp_path / "bisect.json").write_text(json.dumps([{"scenario": "a/b", "line": "first bad verl commit: 77e0f1d"}]))
    rows = with_bisections([{"id": "a/b", "verdict": "FAIL"}, {"id": "c", "verdict": "PASS"}], tmp_path)
    assert rows[0]["bisect"] == "first bad verl commit: 77e0f1d" and "bisect" not in rows[1]


def test_a_resumed_run_marks_its_resume_step_and_its_twin_does_not():
    from parity.reports import plots

    row = result("tiny-qwen3/fsdp2/dp2/fp32/cpu+resume")
    plots.scenario_figure(row | {"provenance": {"resumed": {"after_step": 2}}})
    marked = [line.get_label() for ax in plots._canvas.axes[:4] for line in ax.lines]
    assert marked.count("resumed after step 2") == 4
    assert plots.scenario_figure(row | {"provenance": {"resumed": {"after_step": 2}}}) != plots.scenario_figure(row)
    assert not any("resumed" in line.get_label() for ax in plots._canvas.axes for line in ax.lines)
    assert plots.DPI >= 144  # twice the CSS pixels the page shows it at
