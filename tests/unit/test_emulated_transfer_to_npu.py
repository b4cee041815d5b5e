"""The emulated torch_npu.contrib.transfer_to_npu (tests/emulated_npu/site) against the real module's contract
(Ascend/pytorch torch_npu/contrib/transfer_to_npu.py): with emulated cards, torch.cuda's names of torch_npu.npu's
`__all__` are the emulated torch.npu's and 'cuda' devices are npu devices (the CPU); a mapped name the emulation
lacks refuses; torch.cuda.default_generators stays empty as on the device, saying why; without cards nothing is
patched. Each probe in a fresh interpreter with the site on its path (the module patches torch process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.unit.emulated_probe import SITE, run_probe

PROBE = r"""
import json, torch, torch_npu
from torch_npu.contrib import transfer_to_npu
from torch_npu.emulation import EmulationRefused

def attempt(fn):
    try:
        return ["ok", repr(fn())]
    except EmulationRefused as exc:
        return ["refused", str(exc)]
    except Exception as exc:
        return [type(exc).__name__, str(exc)]

found = {"patched": transfer_to_npu.PATCHED,
         "current_device": attempt(lambda: torch.cuda.current_device()),
         "rng_is_npu": torch.cuda.get_rng_state is torch.npu.get_rng_state,
         "random_rng_is_npu": torch.cuda.random.get_rng_state is torch.npu.get_rng_state,
         "zeros_cuda": attempt(lambda: str(torch.zeros(1, device="cuda").device)),
         "dot_cuda": attempt(lambda: str(torch.ones(1).cuda().device)),
         "module_cuda": attempt(lambda: str(next(torch.nn.Linear(1, 1).cuda().parameters()).device)),
         "memory_summary": attempt(lambda: torch.cuda.memory_summary()),
         "default_generators": attempt(lambda: torch.cuda.default_generators[0]),
         "pinned": attempt(lambda: torch.tensor([1], pin_memory=True)),
         "grad_scaler": attempt(lambda: torch.cuda.amp.GradScaler())}
print(json.dumps(found))
"""


def _probe(**env: str) -> dict:
    done = run_probe(PROBE, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    return {"cards": _probe(PARITY_EMULATED_NPU_CARDS="8"), "unset": _probe()}


def test_cuda_names_resolve_to_the_emulated_npu(probes):
    cards = probes["cards"]
    assert cards["patched"] is True
    assert cards["current_device"] == ["ok", "0"]
    assert cards["rng_is_npu"] and cards["random_rng_is_npu"]
    assert cards["zeros_cuda"] == cards["dot_cuda"] == cards["module_cuda"] == ["ok", "'cpu'"], cards


def test_a_mapped_name_the_emulation_lacks_refuses(probes):
    cards = probes["cards"]
    for key, target in (("memory_summary", "torch_npu.npu.memory_summary"),
                        ("grad_scaler", "torch_npu.npu.amp.GradScaler")):
        assert cards[key][0] == "refused" and target in cards[key][1], cards[key]
    assert cards["pinned"][0] == "refused" and "pinned" in cards["pinned"][1], cards["pinned"]


def test_default_generators_stay_empty_as_on_the_device_and_say_why(probes):
    kind, message = probes["cards"]["default_generators"]
    assert kind == "IndexError" and "transfer_to_npu does not map it" in message, message


def test_without_cards_nothing_is_patched(probes):
    unset = probes["unset"]
    assert unset["patched"] is False
    assert unset["current_device"][0] != "ok"  # CUDA's own: no CUDA in this torch
    assert not unset["rng_is_npu"] and unset["memory_summary"][0] != "refused"
    assert unset["default_generators"][0] == "IndexError" and "transfer_to_npu" not in unset["default_generators"][1]


# it watches a known gap of the Megatron engine on npu (a whole row): the nightly's, not a merge's guard
@pytest.mark.nightly
def test_megatron_strict_row_on_emulated_cards_errors_naming_the_rng_gap(tmp_path):
    """The harness's plain `megatron` engine under transfer_to_npu alone: Megatron-Core's RNG tracker sets its state
    through torch.cuda.default_generators, which transfer_to_npu leaves empty (MindSpeed patches that setter). The
    row must ERROR saying so, not PASS by a generator the device does not have."""
    clean = {k: v for k, v in os.environ.items() if k != "ASCEND_RT_VISIBLE_DEVICES"}
    path = os.pathsep.join([str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-m", "parity.harness.cli", "run", "scenarios/ascend_nightly.yaml",
                           "-k", "tiny-qwen3/megatron/tp2/fp32", "--device", "npu", "--out", str(tmp_path)],
                          env={**clean, "PYTHONPATH": path, "PARITY_EMULATED_NPU_CARDS": "8"}, cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r.get("verdict") for r in rows] == ["ERROR"], done.stdout[-3000:]
    assert "torch.cuda.default_generators" in json.dumps(rows[0]), rows[0]
