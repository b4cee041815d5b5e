"""Every kind of bad input exits 2 with one paragraph naming file, scenario and key — never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.harness.cli import main
from parity.harness.config import devices
from tests.conftest import run_cli

pytestmark = pytest.mark.torch_free

CASES = {
    "yaml_syntax": ("matrix:\n  - model: tiny-qwen3\n    strategy: [fsdp2\n", ["line 4", "YAML syntax error"]),
    "unknown_key": ("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {tpp: 2}}\n",
                    ["key 'layout.tpp'", "did you mean 'tp'"]),
    "unknown_top_level_key": ("matrx: []\n", ["key 'matrx'", "did you mean 'matrix'"]),
    "unknown_strategy": ("matrix:\n  - {model: tiny-qwen3, strategy: minspeed_megatron}\n",
                         ["key 'strategy'", "did you mean 'mindspeed_megatron'"]),
    "retired_strategy": ("matrix:\n  - {model: tiny-qwen3, strategy: mindspeed_llm}\n",
                         ["'mindspeed_llm' is now 'mindspeed_megatron'", "parity migrate"]),
    "retired_kwargs": ("matrix:\n  - {model: tiny-qwen3, strategy: megatron, llm_kwargs: {a: 1}}\n",
                       ["'llm_kwargs' was renamed to 'mcore_kwargs'"]),
    "world_size": ("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 2, nodes: 1, nproc_per_node: 4}}\n",
                   ["key 'layout'", "nproc_per_node(4) != world size 2"]),
    "heads_not_divisible": ("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {ulysses: 4}}\n",
                            ["key 'layout.ulysses'", "must divide the attention heads (4) and KV heads (2)"]),
    "tp_heads": ("matrix:\n  - {model: tiny-qwen3, strategy: megatron, layout: {tp: 4}}\n",
                 ["key 'layout.tp'", "KV heads (2)"]),
    "layers_not_divisible": ("matrix:\n  - {model: tiny-qwen3, strategy: megatron, layout: {pp: 2, vpp: 4}}\n",
                             ["key 'layout.vpp'", "4 layers, not divisible by pp(2) * vpp(4)"]),
    "experts_not_divisible": ("matrix:\n  - {model: tiny-qwen3-moe, strategy: megatron, layout: {dp: 3, ep: 3}, "
                              "workload: {batch_size: 6}}\n", ["key 'layout.ep'", "number of experts (4)"]),
    "seq_len_not_divisible": ("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {ulysses: 2}, "
                              "workload: {prompt_len: 7, response_len: 8}}\n",
                              ["key 'workload'", "15", "not divisible by ulysses(2)"]),
    "unsupported_dim": ("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {pp: 2}}\n",
                        ["key 'layout.pp'", "'fsdp2' does not implement pp"]),
    "layout_owned_kwarg": ("matrix:\n  - {model: tiny-qwen3, strategy: megatron, layout: {tp: 2}, "
                           "mcore_kwargs: {tensor_model_parallel_size: 4}}\n",
                           ["key 'mcore_kwargs.tensor_model_parallel_size'", "set by the scenario's layout.tp"]),
    "kwargs_block_not_read": ("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, mcore_kwargs: {a: 1}}\n",
                              ["key 'mcore_kwargs'", "engine 'fsdp2' does not read mcore_kwargs"]),
    "third_party_spec": ("matrix:\n  - {model: tiny-qwen3, engine: 'parity.examples.plain_engine:PlainHFEngine', "
                         "layout: {dp: 2}}\n", ["key 'layout.dp'", "'PlainHFEngine' does not implement dp"]),
    "too_many_ranks": ("matrix:\n  - {model: tiny-qwen3, strategy: fsdp2, layout: {dp: 32}, "
                       "workload: {batch_size: 32}}\n", ["key 'layout'", "needs 32 cpu ranks", "only 16"]),
    "missing_model_path": ("matrix:\n  - {model: /nonexistent/Qwen3-8B, strategy: hf}\n",
                           ["key 'model'", "/nonexistent/Qwen3-8B", "not a directory"]),
    "unset_model_env": ("matrix:\n  - {model: $PARITY_TEST_UNSET_VAR, strategy: hf}\n",
                        ["environment variable PARITY_TEST_UNSET_VAR is not set"]),
    "missing_engine_module": ("matrix:\n  - {model: tiny-qwen3, engine: 'no_such_pkg.engine:Engine'}\n",
                              ["key 'engine'", "engine module 'no_such_pkg.engine' is not importable"]),
    "bad_dtype": ("matrix:\n  - {model: tiny-qwen3, strategy: hf, dtype: bf61}\n",
                  ["key 'dtype'", "did you mean 'bf16'"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exits_2_with_a_located_message(case, write_yaml, capsys, monkeypatch):
    if case == "third_party_spec":
        pytest.importorskip("torch", reason="imports a torch engine class (the Python 3.10 lane has no torch)")
    monkeypatch.setattr(devices, "CPU_MAX_RANKS", 16)
    text, expected = CASES[case]
    path = write_yaml(text, f"{case}.yaml")
    assert main(["run", str(path), "--out", str(path.parent / "out")]) == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("parity: error: file ") and str(path) in message
    assert len(message.splitlines()) == 1
    for fragment in expected:
        assert fragment in message
    if case not in ("yaml_syntax", "unknown_top_level_key"):
        assert "scenario " in message


def test_a_real_process_exits_2_without_traceback(write_yaml):
    path = write_yaml(CASES["unknown_key"][0])
    result = run_cli("run", str(path), "--out", str(path.parent / "out"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "did you mean 'tp'" in result.stderr


def test_missing_file_is_bad_input(tmp_path):
    result = run_cli("list", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "cannot read scenario file" in result.stderr


HF_ROW = "matrix:\n  - {model: tiny-qwen3, strategy: hf}\n"


@pytest.mark.parametrize("where", ["file", "read-only"])
def test_an_unusable_out_dir_exits_2_before_anything_runs(where, write_yaml, tmp_path, capsys):
    path = write_yaml(HF_ROW)
    out = tmp_path / "taken"
    if where == "file":
        out.write_text("not a directory")
    else:  # /sys refuses new entries even to root (permission bits do not)
        out = Path("/sys/parity-out")
    assert main(["run", str(path), "--out", str(out)]) == 2
    message = capsys.readouterr().err
    assert message.startswith(f"parity: error: --out {out}: ") and "Traceback" not in message
    assert ("a file is there" if where == "file" else "cannot write there: Operation not permitted") in message


def test_an_unusable_out_dir_in_a_real_process_has_no_traceback(write_yaml, tmp_path):
    (tmp_path / "taken").write_text("")
    result = run_cli("run", str(write_yaml(HF_ROW)), "--out", str(tmp_path / "taken" / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot write there: Not a directory" in result.stderr


def test_history_that_is_the_out_dir_is_refused_before_its_results_are_deleted(write_yaml, tmp_path, capsys):
    from parity.reports import results

    earlier = tmp_path / "last-night"
    results.append(earlier, {"id": "a", "verdict": "PASS", "metrics": {}})
    before = (earlier / "results.jsonl").read_text()
    assert main(["run", str(write_yaml(HF_ROW)), "--out", str(earlier), "--history",
                 str(tmp_path / "." / "last-night")]) == 2
    assert "is also the --out directory" in capsys.readouterr().err
    assert (earlier / "results.jsonl").read_text() == before


def test_require_of_a_file_that_does_not_exist_is_bad_input(write_yaml, tmp_path, capsys):
    assert main(["run", str(write_yaml(HF_ROW)), "--out", str(tmp_path / "out"), "--require",
                 str(tmp_path / "cpu.yml")]) == 2
    assert f"--require {tmp_path / 'cpu.yml'}: no such scenario file" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["report", "history --html"])
def test_report_and_history_refuse_an_unusable_out_dir(command, tmp_path, capsys):
    from parity.reports import results

    results.append(tmp_path / "run", {"id": "a", "verdict": "PASS", "metrics": {}})
    (tmp_path / "taken").write_text("")
    assert main([*command.split(), str(tmp_path / "run"), "--out", str(tmp_path / "taken")]) == 2
    assert "a file is there" in capsys.readouterr().err
