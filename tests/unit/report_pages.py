"""Helpers for the report tests: verdict JSON with the metrics the judge stores, and a parser of report.html."""

from __future__ import annotations

from html.parser import HTMLParser

from parity.harness.judge.distribution import edges


def result(run_id: str, verdict: str = "PASS", scale: float = 1e-6, **extra) -> dict:
    strategy, layout, dtype = run_id.split("/")[1:4]
    counts = [0] * (len(edges()) - 1)
    counts[10] = 40
    hist = {"edges": edges(), "logprobs_before": {"counts": counts, "below": 3, "above": 0},
            "logprobs_after": {"counts": counts[::-1], "below": 0, "above": 1}}
    series = {"loss": [0.5, 0.4, 0.3], "grad_norm": [2.0, 1.5, 1.2], "step_time_s": [0.3, 0.1, 0.1],
              "reference_loss": [0.5, 0.41, 0.3], "reference_grad_norm": [2.0, 1.4, 1.2]}
    return {"id": run_id, "verdict": verdict, "reasons": [] if verdict == "PASS" else ["loss rel diff at step 2"],
            "strategy": strategy, "layout": layout, "dtype": dtype, "device": "cpu", "reference": "hf_fp32",
            "metrics": {"logprob_max_abs": scale, "logprob_mean_abs": scale / 4, "loss_rel_max": 1e-7,
                        "grad_norm_rel_max": 2e-7, "tokens_per_s": 700.0, "step_time_s": 0.1,
                        "step_time_spread_s": 0.01, "peak_memory_mb": 360.0, "series": series,
                        "logprob_abs_hist": hist}, **extra}


RESULTS = [result("tiny-qwen3/fsdp2/dp2/fp32/cpu"), result("tiny-qwen3/megatron/tp2/fp32/cpu", scale=2e-6),
           result("tiny-qwen3/fsdp2/dp2/fp32/cpu+grad_scale", "FAIL", 0.5, faults=["grad_scale"]),
           {"id": "tiny-llama/mindspeed_fsdp/dp2/bf16/cpu", "verdict": "SKIP", "reasons": ["needs torch_npu"]}]


class Page(HTMLParser):
    """Rows of the summary table (id -> verdict class) and images per scenario section."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: dict[str, str] = {}
        self.images: dict[str, int] = {}
        self.layout_images = 0
        self._section: str | None = None
        self._in_summary = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("id") == "summary":
            self._in_summary = True
        elif tag == "tr" and self._in_summary and a.get("data-id"):
            self.rows[a["data-id"] or ""] = a.get("class") or ""
        elif tag == "section":
            self._section = a.get("data-id")
            self.images.setdefault(self._section or "", 0)
        elif tag == "img":
            src = a.get("src") or ""
            # embedded, or (a PASS row's, loaded when opened) a file beside the page
            assert src.startswith(("data:image/png;base64,", "figures/")), f"an image from elsewhere: {src[:40]}"
            if self._section:
                self.images[self._section] += 1
            else:
                self.layout_images += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in_summary = False
        elif tag == "section":
            self._section = None


def missing(page: Page, results: list[dict]) -> list[str]:
    """Scenarios without their row, or (when they ran) without their plots."""
    gaps = [f"{r['id']}: no row" for r in results if r["id"] not in page.rows]
    return gaps + [f"{r['id']}: no image" for r in results if r.get("metrics") and not page.images.get(r["id"])]


def night() -> list[dict]:
    """A night as the default matrix gives it (every row of scenarios/cpu.yaml, with metrics and checks), two
    planted FAILs and an ERROR among them, and the NPU rows of scenarios/ascend_nightly.yaml SKIPped."""
    import random
    from pathlib import Path

    from parity.harness.config.matrix import load_file

    root = Path(__file__).resolve().parents[2] / "scenarios"
    rng = random.Random(5)
    rows = []
    for scenario in load_file(root / "cpu.yaml"):
        row = result(scenario.id, scale=rng.uniform(1e-7, 3e-6))
        ratio = rng.uniform(0.01, 0.6)
        row |= {"strategy": scenario.engine_label, "layout": scenario.layout.tag(), "dtype": scenario.dtype,
                "checks": [{"metric": "log-prob before training max |Δ|", "observed": ratio * 5e-5, "limit": 5e-5,
                            "step": None, "lane": "abs", "note": "", "passed": True}]}
        rows.append(row)
    rows[20] |= {"verdict": "FAIL", "reasons": ["pre-clip grad norm rel diff at step 2 = 1 > limit 5e-05 (rel)"],
                 "checks": [{"metric": "pre-clip grad norm rel diff", "observed": 1.0, "limit": 5e-5, "step": 2,
                             "lane": "rel", "note": "", "passed": False}]}
    rows[47] |= {"verdict": "FAIL", "reasons": ["log-prob before training max |Δ| = 0.0246 > limit 5e-05 (abs)"],
                 "checks": [{"metric": "log-prob before training max |Δ|", "observed": 0.0246, "limit": 5e-5,
                             "step": None, "lane": "abs", "note": "", "passed": False}]}
    rows[60] = {"id": rows[60]["id"], "verdict": "ERROR", "strategy": rows[60]["strategy"],
                "layout": rows[60]["layout"], "dtype": rows[60]["dtype"],
                "reasons": ["candidate run error: rank 1 died first: killed by SIGSEGV (signal 11)"]}
    for scenario in load_file(root / "ascend_nightly.yaml"):
        rows.append({"id": scenario.id, "verdict": "SKIP", "strategy": scenario.engine_label,
                     "layout": scenario.layout.tag(), "dtype": scenario.dtype,
                     "reasons": ["device npu: torch_npu is not installed (needs an Ascend image with CANN)"]})
    return rows
