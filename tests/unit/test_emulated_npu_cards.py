"""PARITY_EMULATED_NPU_CARDS: the emulated torch_npu (tests/emulated_npu/site) reports N cards, honours
ASCEND_RT_VISIBLE_DEVICES, and the harness's npu path (harness/config/devices.py availability, prepare_rank, precision
flags, memory) runs on it; unset, it reports no device as before. Each in a fresh interpreter with the site on its
path (the emulation changes torch process-wide at import); every check with its planted input and clean twin."""

from __future__ import annotations

import json

import pytest

from tests.unit.emulated_probe import run_probe

PROBE = r"""
import json, torch, torch_npu
from parity.harness.config import devices
from torch_npu.emulation import EmulationRefused

def attempt(fn):
    try:
        return ["ok", fn()]
    except EmulationRefused as exc:
        return ["refused", str(exc)]

found = {"available": torch.npu.is_available(), "count": torch.npu.device_count(),
         "torch_npu_count": torch_npu.npu.device_count(), "accelerator": torch._C._get_accelerator().type,
         "availability": list(devices.availability("npu"))}
if found["count"]:
    found["prepare_rank_1"] = attempt(lambda: str(devices.prepare_rank("npu", 1, 7)))
    found["current_device"] = torch.npu.current_device()
    found["tensor_device"] = str(torch.ones(1, device=devices.prepare_rank("npu", 1, 7)).device)
    found["set_device_past_the_cards"] = attempt(lambda: torch.npu.set_device(found["count"]))
    found["hf32_off"] = attempt(lambda: setattr(torch.npu.matmul, "allow_hf32", False))
    found["hf32_on"] = attempt(lambda: setattr(torch.npu.conv, "allow_hf32", True))
    found["peak"] = devices.peak_memory_bytes("npu")
    found["reset_peak"] = attempt(lambda: torch.npu.reset_peak_memory_stats())
print(json.dumps(found))
"""


def _probe(**env: str) -> dict:
    done = run_probe(PROBE, **env)
    if done.returncode:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    return {"unset": _probe(), "eight": _probe(PARITY_EMULATED_NPU_CARDS="8"),
            "visible": _probe(PARITY_EMULATED_NPU_CARDS="8", ASCEND_RT_VISIBLE_DEVICES="3,5"),
            "visible_past": _probe(PARITY_EMULATED_NPU_CARDS="8", ASCEND_RT_VISIBLE_DEVICES="3,8")}


def test_unset_reports_no_device_as_before(probes):
    unset = probes["unset"]
    assert (unset["available"], unset["count"]) == (False, 0), unset
    assert unset["availability"] == [0, "torch_npu imports but no NPU is visible"]


def test_n_cards_run_the_harness_npu_path_on_cpu(probes):
    eight = probes["eight"]
    assert (eight["available"], eight["count"], eight["torch_npu_count"]) == (True, 8, 8), eight
    assert eight["availability"] == [8, None]
    assert eight["accelerator"] == "cpu"  # the C++ hooks still say unavailable: tensors stay CPU tensors
    assert eight["prepare_rank_1"] == ["ok", "npu:1"] and eight["current_device"] == 1
    assert eight["tensor_device"] == "cpu"
    assert eight["hf32_off"][0] == "ok" and eight["hf32_on"][0] == "refused", eight
    assert eight["set_device_past_the_cards"][0] == "refused", eight
    assert eight["peak"] > 0 and eight["reset_peak"][0] == "refused", eight


def test_ascend_rt_visible_devices_is_honoured(probes):
    visible = probes["visible"]
    assert (visible["count"], visible["availability"]) == (2, [2, None]), visible
    assert visible["set_device_past_the_cards"][0] == "refused"  # index 2 of 2 visible cards
    assert "PARITY_EMULATED_NPU_CARDS" in probes["visible_past"].get("error", ""), probes["visible_past"]
