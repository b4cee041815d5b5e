"""summary.md / the GitHub step summary render as tables on GitHub: every table is parsed with markdown-it-py's
GFM table rule (a header with more cells than its delimiter row, e.g. an unescaped `|` in `max|Δ|`, is no table
there), the headline table is narrow and FAIL / ERROR rows come first, SKIPs are one line per reason."""

from __future__ import annotations

import pytest
from markdown_it import MarkdownIt

from parity.reports.markdown import render
from parity.reports.table import HEADLINE, markdown_table
from tests.unit.report_pages import RESULTS, result

pytestmark = pytest.mark.torch_free

GFM = MarkdownIt("commonmark").enable("table")


def tables(text: str) -> tuple[list[list[list[str]]], list[str]]:
    """(every table as rows of cell texts, header first; lines that look like table rows but are no table)."""
    tokens = GFM.parse(text)
    found, covered = [], set()
    rows: list[list[str]] = []
    cells: list[str] | None = None
    for token in tokens:
        if token.type == "table_open":
            rows = []
            covered |= set(range(*token.map))
        elif token.type == "tr_open":
            cells = []
        elif token.type == "inline" and cells is not None:
            cells.append(token.content)
        elif token.type == "tr_close":
            rows.append(cells or [])
            cells = None
        elif token.type == "table_close":
            found.append(rows)
    lines = text.splitlines()
    stray = [line for i, line in enumerate(lines) if line.lstrip().startswith("|") and i not in covered]
    return found, stray


def night() -> list[dict]:
    """A night's rows with the characters that break tables: pipes in a name, in a reason, in a check's metric."""
    failing = result("tiny-qwen3/fsdp2/dp2/fp32/cpu+mask_shift", "FAIL", 0.5, faults=["mask_shift"],
                     reasons=["log-prob before training max |Δ| = 0.5 > limit 5e-05 (abs)"],
                     checks=[{"metric": "log-prob before training max |Δ|", "observed": 0.5, "limit": 5e-5,
                              "step": None, "passed": False}])
    piped = result("tiny-qwen3/megatron/tp2/fp32/cpu+a|b", checks=[
        {"metric": "pre-clip grad norm rel diff", "observed": 1e-7, "limit": 5e-5, "step": 2, "passed": True}])
    error = {"id": "tiny-llama/fsdp2/dp2/fp32/cpu", "verdict": "ERROR", "reasons": ["rank 1 died first"]}
    skips = [{"id": f"tiny-qwen3/mindspeed_megatron/tp{n}/bf16/npu", "verdict": "SKIP",
              "reasons": ["device npu: torch_npu is not installed"]} for n in (2, 4, 8)]
    return [*RESULTS, piped, failing, error, *skips]


def test_every_table_of_the_summary_parses_as_a_gfm_table_with_its_cells():
    text = render(night(), wall_s=12.0)
    found, stray = tables(text)
    assert stray == [], "lines GitHub shows as text, not as a table"
    assert len(found) == 4  # headline, errors, speed and memory, strategies side by side
    for rows in found:
        assert len({len(r) for r in rows}) == 1, rows
    headline = found[0]
    assert headline[0] == HEADLINE
    assert [r[0] for r in headline[1:4]] == ["tiny-llama/fsdp2/dp2/fp32/cpu",  # ERROR, then FAILs
                                             "tiny-qwen3/fsdp2/dp2/fp32/cpu+grad_scale",
                                             "tiny-qwen3/fsdp2/dp2/fp32/cpu+mask_shift"]
    assert "tiny-qwen3/megatron/tp2/fp32/cpu+a|b" in [r[0] for r in headline]  # the escaped pipe reads back
    assert not any("SKIP" in r for r in headline)
    errors = found[1]
    assert "log-prob before training max |Δ|" in {r[2] for r in errors}
    assert dict(zip(headline[0], headline[3], strict=True))["worst ÷ limit"] == "1e+04"  # 0.5 / 5e-05


def test_skips_are_one_line_per_reason_with_a_count():
    text = render(night())
    assert text.count("**3 SKIP**: device npu: torch_npu is not installed") == 1
    assert "**1 SKIP**: needs torch_npu" in text
    assert text.count("tiny-qwen3/mindspeed_megatron/tp4/bf16/npu") == 1


def test_the_check_sees_a_table_github_would_drop():
    """The old header `logp max|Δ|`: 22 header cells over 18 delimiter cells, shown as a paragraph."""
    broken = "| id | logp max|Δ| |\n|---|---|\n| a | 1 |\n"
    found, stray = tables(broken)
    assert found == [] and len(stray) == 3
    fixed = markdown_table([["a", "1"]], ["id", "logp max|Δ|"])
    assert tables(fixed) == ([[["id", "logp max|Δ|"], ["a", "1"]]], [])


def test_a_night_with_only_skips_has_no_empty_table():
    text = render([r for r in night() if r["verdict"] == "SKIP"])
    assert tables(text) == ([], []) and "**3 SKIP**" in text
