"""verl's MindSpeed engine in the emulated NPU lane: scenarios/emulated_npu_verl.yaml run over the real MindSpeed
source (PARITY_MINDSPEED_SRC) and the emulated torch_npu; the record must show verl's MindSpeed engine class,
MindSpeed's patches and its fused attention, and verl's Ascend code path. SKIPs where PARITY_MINDSPEED_SRC is not
set or verl is not installed (verl has its own lane: it pins transformers < 5.11)."""

from __future__ import annotations

from typing import Any

import pytest

from parity.engines.verl import source
from tests.emulated_npu import lane

pytestmark = [pytest.mark.emulated_npu,
              pytest.mark.skipif(source.problem() is not None, reason=f"verl: {source.problem()}")]

SCENARIOS = lane.REPO / "scenarios" / "emulated_npu_verl.yaml"


@pytest.fixture(scope="module")
def verl_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    src = lane.mindspeed_source()
    lane.skip_on_bad_megatron_pairing(src)
    out = tmp_path_factory.mktemp("verl-lane")
    done = lane.run_harness(["-m", "parity.harness.cli", "run", str(SCENARIOS), "--out", str(out)], src)
    found = lane.results(out)
    assert found, f"the lane wrote no results:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return found


def test_verl_mindspeed_rows_pass_or_are_marked_broken(verl_rows: dict[str, dict[str, Any]]) -> None:
    for scenario_id, row in verl_rows.items():
        if row["verdict"] == "SKIP":
            assert any("marked broken" in r for r in row["reasons"]), (scenario_id, row["reasons"])
        else:
            assert row["verdict"] == "PASS", (scenario_id, row["reasons"])
    assert any(row["verdict"] == "PASS" for row in verl_rows.values())


def test_records_show_verls_mindspeed_engine_on_mindspeeds_fused_attention(
        verl_rows: dict[str, dict[str, Any]]) -> None:
    ran = {k: v for k, v in verl_rows.items() if v["verdict"] != "SKIP"}
    assert ran
    for scenario_id, row in ran.items():
        provenance = row["record"]["provenance"]
        verl = provenance["verl"]
        assert verl["engine_class"] == "verl.workers.engine.mindspeed.transformer_impl.MindspeedEngineWithLMHead"
        assert "emulated-npu-available" in verl["shims"] and "mbridge-local-spec" not in verl["shims"]
        mindspeed = provenance["mindspeed"]
        assert mindspeed["patches"] > 0 and mindspeed["fused_ops_source"] == "emulated torch_npu"
        assert mindspeed["fused_ops"].get("npu_fusion_attention", 0) > 0, (scenario_id, mindspeed["fused_ops"])
        # mbridge's TE spec, built from MindSpeed's TE stand-ins
        assert all(c.startswith("mindspeed.") for c in mindspeed["attention"]["linear_qkv"]), mindspeed



def test_packed_cp2_runs_mindspeeds_ring_attention_on_verls_split(verl_rows: dict[str, dict[str, Any]]) -> None:
    """The packed cp2 row PASSes because MindSpeed's ring attention (megatron_cp_algo) takes verl's per-sequence
    split: the record must show that attention ran, not a gather fallback."""
    rows = {k: v for k, v in verl_rows.items() if "/cp2/" in k and v["verdict"] != "SKIP"}
    assert len(rows) == 1, sorted(verl_rows)
    for scenario_id, row in rows.items():
        attention = row["record"]["provenance"]["mindspeed"]["attention"]
        assert attention["core_attention"] == ["MindSpeedCPDotProductAttention"], (scenario_id, attention)
        assert attention["context_parallel_algo"] == ["megatron_cp_algo"], (scenario_id, attention)
        assert row["verdict"] == "PASS", (scenario_id, row["reasons"])


def test_fingerprint_of_verls_mindspeed_engine_names_the_module_a_planted_fault_scales(
        verl_rows: dict[str, dict[str, Any]], tmp_path: Any) -> None:
    """The lane's first row (tp2-sp, packed) is the clean twin: its per-module fingerprint was compared at every
    step and PASSed; the same row with one module's gradients x1.5 at step 1, in the model verl built, FAILs naming
    that module and no other at step 1."""
    import yaml

    from parity.harness.contract.grad_groups import describe

    text = yaml.safe_load(SCENARIOS.read_text())
    row = text["matrix"][0]
    clean_id = next(k for k in verl_rows if k.endswith("/tp2-sp/bf16/cpu+packed+vs-hf_master_weights"))
    clean = verl_rows[clean_id]
    assert clean["verdict"] == "PASS" and all(w is not None for w in clean["metrics"]["group_grad_norm_rel"]), clean
    group = "layers.1.self_attn.o_proj"
    planted = tmp_path / "planted.yaml"
    planted.write_text(yaml.safe_dump({"defaults": text["defaults"], "matrix": [
        {**row, "faults": [{"kind": "module_grad_scale", "key": group, "step": 1, "factor": 1.5}]}]}))
    out = tmp_path / "out"
    lane.run_harness(["-m", "parity.harness.cli", "run", str(planted), "--out", str(out)], lane.mindspeed_source())
    (verdict,) = lane.results(out).values()
    assert verdict["verdict"] == "FAIL", verdict["reasons"]
    named = [r for r in verdict["reasons"] if " grad norm rel diff at step 1" in r and not r.startswith("pre-clip")]
    assert named and all(r.startswith(f"{describe(group)} grad norm rel diff at step 1") for r in named), \
        verdict["reasons"]
