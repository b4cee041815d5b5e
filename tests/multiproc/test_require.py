"""CI cannot be green by skipping: with `--parity-require FILE` (`parity run --require FILE`) a row of FILE that
would SKIP here is an ERROR naming it and why, a row whose golden is not recorded too ("no golden", first in the
summary and on the page, naming the lane); rows marked broken and rows of other files still SKIP. The missing
package is injected: a `megatron` without `core` shadows the installed one, as a broken install would."""

from __future__ import annotations

import os
import subprocess
import sys

REQUIRED = """matrix:
  - {model: tiny-qwen3, strategy: megatron, layout: {tp: 2}}
  - {model: tiny-qwen3, strategy: megatron, layout: {pp: 2}, broken: "tracked in #99"}
  - {model: tiny-qwen3, strategy: hf, reference: "golden:/nonexistent/goldens/tiny-qwen3__fsdp2__dp2__fp32__cuda"}
"""
OPTIONAL = "matrix:\n  - {model: tiny-qwen3, strategy: megatron, layout: {dp: 2}}\n"


def test_a_required_row_that_would_skip_fails_the_session_naming_it(tmp_path):
    shadow = tmp_path / "shadow" / "megatron"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")  # importable, but megatron.core is not
    (tmp_path / "required.yaml").write_text(REQUIRED)
    (tmp_path / "optional.yaml").write_text(OPTIONAL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), os.environ.get("PYTHONPATH", "")]),
           "PARITY_LANE": "a2b3-8"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "required.yaml",
                           "optional.yaml", "--parity-out=out", "--parity-require=required.yaml"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 1, out
    assert "2 failed, 2 skipped" in out
    assert ("ERROR tiny-qwen3/megatron/tp2/fp32/cpu\n  required to run here (--require "
            f"{tmp_path / 'required.yaml'}) but it would SKIP: ") in out
    assert "megatron-core is not installed" in out.split("required to run here", 1)[1].splitlines()[0]
    assert "marked broken: tracked in #99" in out  # a declared broken row may skip
    golden = out.split("ERROR tiny-qwen3/hf/single/fp32/cpu\n", 1)[1].splitlines()[0]
    assert ("no golden: golden reference /nonexistent/goldens/tiny-qwen3__fsdp2__dp2__fp32__cuda is not recorded"
            in golden and "-k 'tiny-qwen3/fsdp2/dp2/fp32/cuda'" in golden)  # an ERROR, naming what records it
    banner = "no golden: 1 row of lane a2b3-8 not run; record with .github/workflows/goldens.yml and pin"
    assert banner in "\n".join((tmp_path / "out" / "summary.md").read_text().splitlines()[:4])
    page = (tmp_path / "out" / "report.html").read_text()
    assert banner in page and page.index(banner) < page.index('id="failures"')
    assert "SKIPPED [1] " in out and "optional.yaml" not in out.split("FAILED", 1)[-1].split("\n")[0]
