"""A night whose goldens are absent says so first: summary.md (and so the step summary) and report.html open on
"no golden: N rows of lane X not run", above the verdict counts. The planted night holds rows without their golden
(SKIP, and ERROR as --require makes them); the clean twin the same rows judged against a golden."""

from __future__ import annotations

import io

import pytest

from parity.harness.config.validate import NO_GOLDEN
from parity.reports import html, markdown, publish
from tests.unit.report_pages import result

pytestmark = pytest.mark.torch_free

REASON = (f"{NO_GOLDEN}: golden reference $PARITY_GOLDEN_DIR/qwen3-8b__fsdp2__dp8__bf16__cuda is not recorded (its "
          "directory variable PARITY_GOLDEN_DIR is not set): record it ...")
BANNER = ("no golden: 2 rows of lane a2b3-8 not run; record with .github/workflows/goldens.yml and pin "
          "PARITY_GOLDENS_TAG")


def _night(planted: bool) -> list[dict]:
    rows = [result("tiny-qwen3/fsdp2/dp2/bf16/npu")]
    if planted:
        rows += [{"id": "qwen3-8b/fsdp2/dp8/bf16/npu", "verdict": "SKIP", "reasons": [REASON]},
                 {"id": "qwen3-8b/megatron/tp4-pp2-sp/bf16/npu", "verdict": "ERROR",
                  "reasons": [f"required to run here (--require scenarios/ascend_nightly.yaml) but it would SKIP: "
                              f"{REASON}"]}]
    else:
        rows += [result("qwen3-8b/fsdp2/dp8/bf16/npu"), result("qwen3-8b/megatron/tp4-pp2-sp/bf16/npu")]
    return rows


@pytest.mark.parametrize("planted", [True, False], ids=["no-golden", "clean"])
def test_the_first_screen_says_no_golden(planted):
    results = _night(planted)
    summary = markdown.render(results, lane="a2b3-8").splitlines()
    assert (BANNER in "\n".join(summary[:3])) is planted  # above the counts, the first thing under the title
    assert any(NO_GOLDEN in line for line in summary) is planted
    page = html.render(results, figures=[None] * len(results), lane="a2b3-8")
    assert (BANNER in page) is planted
    if planted:
        assert page.index(BANNER) < page.index('data-verdict="FAIL"') < page.index('id="failures"')


def test_without_a_lane_the_line_still_counts_the_rows():
    assert "no golden: 2 rows not run;" in markdown.render(_night(True))


def test_publish_names_the_lane_ci_nightly_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_LANE", "a2b3-8")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    publish.publish(tmp_path, _night(True), stream=io.StringIO(), page=False)
    assert BANNER in (tmp_path / "summary.md").read_text().splitlines()[2]
