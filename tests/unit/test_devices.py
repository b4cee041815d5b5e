"""harness/config/devices.py: what each device kind is, whether it is here, and the emulated-NPU detection that
must never import a real torch_npu."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

import pytest

from parity.harness.config import devices


def test_cpu_is_always_available_and_others_say_why_not():
    count, why = devices.availability("cpu")
    assert count == devices.CPU_MAX_RANKS and why is None
    count, why = devices.availability("cuda")
    assert count == 0 and "no CUDA device" in why
    if "torch_npu" not in sys.modules:
        count, why = devices.availability("npu")
        assert count == 0 and "torch_npu" in why


def test_every_device_kind_has_a_backend_and_accelerators_a_visible_variable():
    assert devices.DEVICE_KINDS["cpu"].backend == "gloo"
    for name in ("cuda", "npu"):
        kind = devices.DEVICE_KINDS[name]
        assert kind.visible_env and kind.determinism_env, name
    assert devices.DEVICE_KINDS["npu"].determinism_env["HCCL_DETERMINISTIC"] == "true"
    # LCCL's LCOC off, as verl's precision-alignment guide sets it beside LCCL_DETERMINISTIC
    assert devices.DEVICE_KINDS["npu"].determinism_env["ATB_LLM_LCOC_ENABLE"] == "0"


def _fake_torch_npu(root, emulation_text: str | None):
    package = root / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('a real torch_npu must never be imported here')\n")
    if emulation_text is not None:
        (package / "emulation.py").write_text(emulation_text)
    return root


@pytest.mark.parametrize(("emulation", "expected"), [("EMULATED = True\n", True), (None, False),
                                                     ("EMULATED = False\n", False)])
def test_npu_emulated_reads_files_without_importing(tmp_path, monkeypatch, emulation, expected):
    monkeypatch.syspath_prepend(str(_fake_torch_npu(tmp_path, emulation)))
    assert devices.npu_emulated() is expected
    assert "torch_npu" not in sys.modules


def test_npu_emulated_is_false_without_any_torch_npu(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])  # nowhere to find one, whatever this environment holds
    assert importlib.util.find_spec("torch_npu") is None
    assert devices.npu_emulated() is False


def test_prepare_rank_on_cpu_seeds_and_returns_cpu(monkeypatch):
    import torch

    device = devices.prepare_rank("cpu", 0, seed=7)
    first = torch.rand(3)
    devices.prepare_rank("cpu", 0, seed=7)
    assert device == torch.device("cpu") and torch.equal(first, torch.rand(3))


def test_peak_memory_on_cpu_is_the_resident_set():
    assert devices.peak_memory_bytes("cpu") > 10 * 2**20  # a python process with torch imported


@pytest.mark.parametrize(("cores", "ranks", "shares"), [
    (2, 2, [[0], [1]]),
    (2, 4, [[0], [1], [0], [1]]),  # more ranks than cores: one core each, round robin
    (16, 2, [list(range(8)), list(range(8, 16))]),
    (3, 2, [[0], [1]]),
    (2, 1, [[0, 1]]),
])
def test_each_cpu_rank_gets_its_own_slice_of_the_cores(cores, ranks, shares):
    allowed = [4 + 2 * core for core in range(cores)]  # a cpuset need not start at 0 nor be contiguous
    assert [devices.cpu_share(allowed, rank, ranks) for rank in range(ranks)] == [
        [allowed[core] for core in share] for share in shares]


def _bind_in_child(ranks: int, queue) -> None:
    import os

    import torch

    cores = devices.bind_cpu_rank(ranks - 1, ranks)
    queue.put((cores, sorted(os.sched_getaffinity(0)), torch.get_num_threads()))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity call on this OS")
@pytest.mark.parametrize("bind", ["1", "0"])
def test_a_cpu_rank_is_pinned_to_its_cores_unless_told_not_to(monkeypatch, bind):
    """In a forked child, as the rank is: the pytest process keeps its cores."""
    import multiprocessing

    monkeypatch.setenv("PARITY_CPU_BIND", bind)
    allowed = sorted(os.sched_getaffinity(0))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_bind_in_child, args=(len(allowed) + 1, queue))
    child.start()
    cores, affinity, threads = queue.get(timeout=60)
    child.join(timeout=60)
    if bind == "1":  # rank N of N + 1 ranks wraps around to the first core
        assert cores == affinity == [allowed[0]] and threads == 1
    else:
        assert cores is None and affinity == allowed and threads == 1
    assert sorted(os.sched_getaffinity(0)) == allowed


def test_plain_megatron_on_npu_imports_transfer_to_npu_first_as_mindspeed_does(tmp_path, monkeypatch):
    """Megatron-Core binds torch.cuda's RNG functions at import: on npu the rank imports torch_npu's transfer_to_npu
    before it (mindspeed/megatron_adaptor.py line 11), and a module imported too early is an error, not a rank that
    dies later in torch.cuda. The shim here is a stand-in module with the real one's name held in the kind."""
    from parity.engines.specs import MEGATRON

    assert devices.DEVICE_KINDS["npu"].cuda_api_shim == "torch_npu.contrib.transfer_to_npu"
    assert MEGATRON.cuda_apis == ("megatron",) and devices.DEVICE_KINDS["cpu"].cuda_api_shim is None
    (tmp_path / "fake_cuda_shim.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(devices.DEVICE_KINDS, "npu", dataclasses.replace(devices.DEVICE_KINDS["npu"],
                                                                         cuda_api_shim="fake_cuda_shim"))
    monkeypatch.delitem(sys.modules, "fake_cuda_shim", raising=False)
    assert devices.import_cuda_api_shim("cpu", ("fake_binds",)) is None
    monkeypatch.setitem(sys.modules, "fake_binds", object())  # planted: the bound module came first
    with pytest.raises(RuntimeError, match="fake_cuda_shim must be imported before fake_binds on npu"):
        devices.import_cuda_api_shim("npu", ("fake_binds",))
    assert "fake_cuda_shim" not in sys.modules
    monkeypatch.delitem(sys.modules, "fake_binds")  # the clean twin
    assert devices.import_cuda_api_shim("npu", ("fake_binds",)) == "fake_cuda_shim"
    assert sys.modules["fake_cuda_shim"].IMPORTED
