"""One rank of one run: set up the device and process group, drive the engine through the workload, and
(on rank 0) write the RunRecord. Used by both launchers: forked ranks and torchrun
(`python -m parity.harness.run.worker`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import numbers
import os
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parity.harness.contract.faults import FaultPlan
from parity.harness.contract.schema import Scenario
from parity.harness.run.deaths import done_marker, failure_marker


@dataclass(frozen=True, slots=True)
class RunJob:
    """What every rank of one run needs; JSON-able so torchrun ranks can read it from a file."""

    run_id: str
    scenario: dict[str, Any]
    """Scenario.model_dump(mode='json')."""
    record_dir: str
    cache_dir: str
    provenance: dict[str, Any]
    visible_devices: dict[str, str] | None = None
    """Visible-devices variable for the ranks (the leased cards), set before the device backend loads."""
    stage: dict[str, Any] | None = None
    """Stage(...) as a dict when this launch is one part of a resumed or converted run; None = the whole run."""
    body: str | None = None
    """'module:function' with run_rank's signature that the ranks run instead of run_rank (the rollout lane's
    trainer: parity.rollout.trainer); None = run_rank."""
    body_args: dict[str, Any] | None = None
    """What that body reads besides the scenario (JSON-able)."""

    def rank_body(self) -> Any:
        """The function the ranks run."""
        if self.body is None:
            return run_rank
        module, _, name = self.body.partition(":")
        return getattr(importlib.import_module(module), name)

    def to_file(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def from_file(cls, path: Path) -> RunJob:
        return cls(**json.loads(Path(path).read_text()))


@dataclass(frozen=True, slots=True)
class Stage:
    """One launch of a run that goes through the engine's own checkpoint (Scenario.resume / Scenario.convert)."""

    first_step: int = 1
    last_step: int | None = None
    """The last step this launch trains (None: the workload's last); the after-training forward runs only there."""
    load_from: str | None = None
    """A checkpoint this launch's FRESH processes continue from: Engine.load_checkpoint after setup, and the
    rollout's log-probs the first launch scored (the old log-probs of every step's loss)."""
    save_to: str | None = None
    """Save the engine's checkpoint (Engine.save_checkpoint) and the rollout's log-probs here after last_step."""
    convert_to: str | None = None
    """After saving: rank 0 converts the checkpoint to HF here (Engine.convert_checkpoint) and scores the batch
    with that HF checkpoint in the reference engine (record tensors logprobs_converted / entropy_converted)."""


#: the rollout's log-probs in a saved checkpoint directory (RL data, not engine state: the harness keeps them)
ROLLOUT_FILE = "parity_rollout_logprobs.pt"


def join_process_group(scenario: Scenario, rank: int, world_size: int, local_rank: int,
                       store: Any | None) -> tuple[Any, Any]:
    """A rank's start, before any engine code: its CPU binding, the device's CUDA-API shim where the engine's
    modules call torch.cuda by name (before they import), the device seeded, the process group joined. Returns
    (the CPUs it is bound to or None, its device)."""
    import torch.distributed as dist

    from parity.harness.config import devices
    from parity.harness.config.registry import spec_for

    cpus = devices.bind_cpu_rank(local_rank, scenario.layout.ranks_per_node) if scenario.device == "cpu" else None
    if binds := spec_for(scenario).cuda_apis:  # before torch_npu's own import and the engine's (Megatron-Core)
        devices.import_cuda_api_shim(scenario.device, binds)
    device = devices.prepare_rank(scenario.device, local_rank, scenario.workload.seed)
    backend = devices.DEVICE_KINDS[scenario.device].backend
    if store is not None:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    else:
        dist.init_process_group(backend, rank=rank, world_size=world_size)
    return cpus, device


def run_rank(job: RunJob, rank: int, world_size: int, local_rank: int, store: Any | None) -> None:
    """Body of one rank. Raises on failure; the caller turns that into a hard exit."""
    import torch.distributed as dist

    from parity.harness.config import devices
    from parity.harness.config.flops import train_flops_per_token
    from parity.harness.config.models import ensure_checkpoint, model_shape
    from parity.harness.config.registry import load_engine_class
    from parity.harness.contract.engine import EngineContext
    from parity.harness.contract.workload import build_batch, shift_masks
    from parity.harness.run.records import RunRecord, StepRecord

    if (preloaded := sys.modules.get("parity.harness.run.rank_warnings")) is not None:
        preloaded.replay()  # forked from the forkserver: its import warnings belong in this rank's log
    scenario = Scenario.model_validate(job.scenario)
    cpus, device = join_process_group(scenario, rank, world_size, local_rank, store)
    started = time.perf_counter()
    faults = FaultPlan(scenario.faults, rank)
    checkpoint = ensure_checkpoint(scenario.model, Path(job.cache_dir))
    ctx = EngineContext(scenario=scenario, checkpoint=checkpoint, rank=rank, world_size=world_size,
                        local_rank=local_rank, device=device, faults=faults)
    engine = load_engine_class(scenario)(ctx)
    engine.setup()
    stage = Stage(**job.stage) if job.stage else Stage()
    last_step = stage.last_step or scenario.workload.steps

    shape = model_shape(scenario.model) or model_shape(str(checkpoint))
    clean = build_batch(scenario.workload, shape.vocab_size)
    batch = shift_masks(clean) if faults.has("mask_shift") else clean

    expected = tuple(clean.response_mask.shape)
    t0 = time.perf_counter()
    before = fingerprint = None
    if stage.load_from is not None:
        import torch

        engine.load_checkpoint(Path(stage.load_from))
        old_logprobs = torch.load(Path(stage.load_from) / ROLLOUT_FILE)
    else:
        with fingerprinting(engine) as recorder:
            before = checked_tokens(engine.forward(batch), rank, expected, "forward (before training)")
        fingerprint = recorder.gather() if recorder is not None else None
        old_logprobs = _broadcast(before.logprobs if before is not None else None, rank)
    devices.synchronize(scenario.device)
    forward_time = time.perf_counter() - t0
    steps = []
    for step in range(stage.first_step, last_step + 1):
        faults.before_step(step)
        t0 = time.perf_counter()
        out = engine.train_step(batch, old_logprobs, step)
        devices.synchronize(scenario.device)
        if rank == 0:
            updates = checked_updates(out, step, scenario.workload.updates_per_step)
            share = (time.perf_counter() - t0) / len(updates)
            steps += [StepRecord(step=step, update=u, loss=loss, grad_norm=grad_norm, step_time_s=share)
                      for u, (loss, grad_norm) in enumerate(updates[:-1], 1)]
            loss, grad_norm = updates[-1]
            steps.append(StepRecord(step=step, update=len(updates), loss=loss, grad_norm=grad_norm,
                                    step_time_s=share, group_grad_norms=checked_groups(out, step),
                                    expert_load=checked_expert_load(out, step), lr=checked_lr(out, step)))
    after = None
    if last_step == scenario.workload.steps:
        after = checked_tokens(engine.forward(batch), rank, expected, "forward (after training)")
    converted = save_and_convert(engine, stage, old_logprobs, ctx, batch, expected) if stage.save_to else None
    applied = engine.applied_kwargs()
    effective_dtype = engine.effective_dtype()
    optimizer_steps = engine.optimizer_steps()
    timed = timed_steps(engine, scenario, batch, old_logprobs, faults, rank) if job.stage is None else []
    # optional engine hook: what ran underneath (MindSpeed: its version, patches applied, fused-op counts)
    engine_provenance = getattr(engine, "run_provenance", dict)()
    engine.teardown()
    peaks = [0] * world_size
    dist.all_gather_object(peaks, devices.peak_memory_bytes(scenario.device))
    if rank == 0:
        tensors = {"response_mask": clean.response_mask}
        for phase, out in (("before", before), ("after", after), ("converted", converted)):
            if out is not None:
                tensors |= {f"logprobs_{phase}": out.logprobs, f"entropy_{phase}": out.entropy}
        record = RunRecord(
            run_id=job.run_id, scenario_hash=scenario.content_hash(), status="ok", steps=steps,
            tensors=tensors,
            forward_time_s=forward_time, peak_memory_bytes=peaks[0], peak_memory_per_rank=peaks,
            tokens_per_step=int(clean.attention_mask.sum()),
            flops_per_token=train_flops_per_token(checkpoint, int(clean.input_ids.shape[1])),
            applied_kwargs=applied, effective_dtype=effective_dtype, optimizer_steps=optimizer_steps,
            provenance={**job.provenance, **_rank_provenance(scenario.device), "dtype": scenario.dtype,
                        "world_size": world_size, "rank0_cpu_cores": cpus,
                        **engine_provenance},
            compute_time_s=time.perf_counter() - started, timed_step_times_s=timed, fingerprint=fingerprint)
        record.save(Path(job.record_dir))
    dist.barrier()


@contextlib.contextmanager
def fingerprinting(engine: Any) -> Iterator[Any]:
    """Hooks on the modules the engine exposes (optional `Engine.fingerprint_points`) for one forward; yields the
    Recorder, or None when the engine exposes none."""
    try:
        points = getattr(engine, "fingerprint_points", lambda: None)()
    except Exception as exc:  # a diagnostic: it never fails the run (every rank fails alike: none gathers)
        print(f"fingerprint not taken: Engine.fingerprint_points raised {type(exc).__name__}: {exc}",
              file=sys.stderr)
        points = None
    if points is None:
        yield None
        return
    from parity.harness.contract.fingerprint import Recorder

    with Recorder(points) as recorder:
        yield recorder


def save_and_convert(engine: Any, stage: Stage, old_logprobs: Any, ctx: Any, batch: Any,
                     expected: tuple[int, ...]) -> Any:
    """Save the engine's own checkpoint (every rank) with the rollout's log-probs; with `convert_to`, rank 0 then
    converts it to HF with the engine's converter and scores the batch with the converted checkpoint in the
    reference engine (plain transformers, one process): what a user of the converted model gets. Returns rank 0's
    TokenOutputs of the converted model (None elsewhere, or without conversion)."""
    import torch
    import torch.distributed as dist

    from parity.harness.config.registry import REFERENCE, load_engine_class
    from parity.harness.contract.engine import EngineContext
    from parity.harness.contract.faults import FaultPlan
    from parity.harness.contract.schema import Layout

    directory = Path(stage.save_to)
    directory.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    engine.save_checkpoint(directory)
    if ctx.rank == 0:
        torch.save(old_logprobs.cpu(), directory / ROLLOUT_FILE)
    dist.barrier()
    converted = None
    if stage.convert_to is not None and ctx.rank == 0:
        hf_dir = Path(stage.convert_to)
        type(engine).convert_checkpoint(directory, hf_dir, ctx.checkpoint, ctx.faults)
        scenario = ctx.scenario
        hf_run = Scenario(model=str(hf_dir), strategy=REFERENCE.name, workload=scenario.workload.padded(), dtype="fp32",
                          device=scenario.device, layout=Layout())
        hf_ctx = EngineContext(scenario=hf_run, checkpoint=hf_dir, rank=0, world_size=1, local_rank=ctx.local_rank,
                               device=ctx.device, faults=FaultPlan())
        scorer = load_engine_class(hf_run)(hf_ctx)
        scorer.setup()
        converted = checked_tokens(scorer.forward(batch), 0, expected, "forward of the converted HF checkpoint")
    dist.barrier()
    return converted


def timed_steps(engine: Any, scenario: Scenario, batch: Any, old_logprobs: Any, faults: FaultPlan,
                rank: int) -> list[float]:
    """A perf-gated scenario's extra training steps, each timed (rank 0's view, after a device sync), once what is
    judged has been read: one warm step is one draw of a noisy clock, their median is a figure a gate can use."""
    from parity.harness.config import devices

    if scenario.perf is None:
        return []
    times = []
    for step in range(scenario.workload.steps + 1, scenario.workload.steps + 1 + scenario.perf.timed_steps):
        faults.before_step(step)
        t0 = time.perf_counter()
        engine.train_step(batch, old_logprobs, step)
        devices.synchronize(scenario.device)
        times.append(time.perf_counter() - t0)
    return times if rank == 0 else []


class EngineOutputError(TypeError):
    """An engine returned something other than the contract's types (the run ERRORs naming the method)."""


def checked_tokens(out: Any, rank: int, shape: tuple[int, ...], call: str) -> Any:
    """Rank 0's TokenOutputs as fp32 CPU tensors of the batch's [B, R] shape. Non-finite VALUES pass (the
    comparison FAILs them, naming the metric); a wrong type, shape or dtype is the engine's error."""
    import torch

    from parity.harness.contract.engine import TokenOutputs

    if rank != 0:
        return out
    where = f"Engine.{call}"
    if not isinstance(out, TokenOutputs):
        raise EngineOutputError(f"{where} returned {type(out).__name__} on rank 0, expected TokenOutputs")
    fields = {}
    for name in ("logprobs", "entropy"):
        value = getattr(out, name)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
            raise EngineOutputError(f"{where}: {name} is {kind}, expected a floating-point tensor")
        if tuple(value.shape) != shape:
            raise EngineOutputError(f"{where}: {name} has shape {list(value.shape)}, expected [B, R] = {list(shape)}")
        fields[name] = value.detach().float().cpu()
    return TokenOutputs(**fields)


def checked_step(out: Any, step: int) -> tuple[float, float]:
    """(loss, grad_norm) as plain floats: a float, int or one-element tensor is accepted, anything else is the
    engine's error."""
    import torch

    from parity.harness.contract.engine import StepOutput

    where = f"Engine.train_step (step {step})"
    if not isinstance(out, StepOutput):
        raise EngineOutputError(f"{where} returned {type(out).__name__} on rank 0, expected StepOutput")
    values = []
    for name in ("loss", "grad_norm"):
        value = getattr(out, name)
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex:
            value = value.detach().item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise EngineOutputError(f"{where}: StepOutput.{name} is {type(value).__name__} {value!r:.60}, "
                                    "expected a float")
        values.append(float(value))
    return values[0], values[1]


def checked_updates(out: Any, step: int, expected: int) -> list[tuple[float, float]]:
    """(loss, pre-clip grad norm) of each of the step's `expected` optimizer updates: StepOutput.updates, or its
    loss / grad_norm where the step takes one update."""
    import torch

    last = checked_step(out, step)
    given = out.updates
    where = f"Engine.train_step (step {step}): StepOutput.updates"
    if given is None:
        if expected != 1:
            raise EngineOutputError(f"{where} is None, but the workload takes {expected} optimizer updates per step "
                                    "(mini_batches x ppo_epochs): report each update's loss and grad norm")
        return [last]
    if not isinstance(given, list | tuple) or len(given) != expected:
        raise EngineOutputError(f"{where} is {given!r:.80}, expected a list of {expected} (loss, grad_norm) pairs, "
                                "one per optimizer update of the step (mini_batches x ppo_epochs)")
    pairs = []
    for u, pair in enumerate(given, 1):
        values = list(pair) if isinstance(pair, list | tuple) and len(pair) == 2 else None
        for i, value in enumerate(values or []):
            if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex:
                values[i] = value = value.detach().item()
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                values = None
                break
        if values is None:
            raise EngineOutputError(f"{where}: update {u} is {pair!r:.60}, expected (loss, grad_norm) floats")
        pairs.append((float(values[0]), float(values[1])))
    return pairs


def checked_groups(out: Any, step: int) -> dict[str, float] | None:
    """StepOutput.group_grad_norms as {group: float}, or None when the engine reports none."""
    groups = out.group_grad_norms
    if groups is None:
        return None
    where = f"Engine.train_step (step {step}): StepOutput.group_grad_norms"
    if not isinstance(groups, dict):
        raise EngineOutputError(f"{where} is {type(groups).__name__}, expected a dict of group name -> float")
    checked = {}
    for name, value in groups.items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise EngineOutputError(f"{where}: entry {name!r}: {value!r:.60} is not a float")
        checked[name] = float(value)
    return checked


def checked_expert_load(out: Any, step: int) -> dict[str, list[float]] | None:
    """StepOutput.expert_load as {layer: [tokens per expert]}, or None when the engine reports none."""
    loads = out.expert_load
    if loads is None:
        return None
    where = f"Engine.train_step (step {step}): StepOutput.expert_load"
    if not isinstance(loads, dict):
        raise EngineOutputError(f"{where} is {type(loads).__name__}, expected a dict of layer -> list of floats")
    checked = {}
    for name, counts in loads.items():
        if (not isinstance(name, str) or not isinstance(counts, list | tuple)
                or not all(isinstance(c, numbers.Real) and not isinstance(c, bool) for c in counts)):
            raise EngineOutputError(f"{where}: entry {name!r}: {counts!r:.60} is not a list of numbers")
        checked[name] = [float(c) for c in counts]
    return checked


def checked_lr(out: Any, step: int) -> list[float] | None:
    """StepOutput.lr as a list of floats (one per param group), or None when the engine reports none."""
    lrs = out.lr
    if lrs is None:
        return None
    where = f"Engine.train_step (step {step}): StepOutput.lr"
    if not isinstance(lrs, list | tuple) or not lrs or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) for v in lrs):
        raise EngineOutputError(f"{where} is {lrs!r:.60}, expected a non-empty list of floats (one per param group)")
    return [float(v) for v in lrs]


def _broadcast(tensor: Any, rank: int) -> Any:
    """Rank 0's whole-batch tensor on every rank (engines return results on rank 0 only)."""
    import torch.distributed as dist

    box = [tensor]
    dist.broadcast_object_list(box, src=0)
    return box[0] if rank != 0 else tensor


def package_versions() -> dict[str, str]:
    """The versions of the packages a run's numbers depend on, as installed where this runs (a rank; the runner
    for rows that launched none)."""
    import importlib.metadata as md

    versions = {}
    for package in ("torch", "transformers", "megatron-core", "torch_npu", "mindspeed"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            continue
    return versions


def _rank_provenance(device: str) -> dict[str, Any]:
    versions = package_versions()
    name = socket.gethostname()
    if device != "cpu":
        from parity.harness.config.devices import device_module

        name = device_module(device).get_device_name()
    image = os.environ.get("PARITY_IMAGE")  # the container image a CI lane runs in, when it says
    cann = cann_version() if device == "npu" else None
    megatron_lm = source_checkout("megatron.core")
    return {"versions": versions, "device_name": name, "host": socket.gethostname(), "image": image,
            **({"cann": cann} if cann else {}), **({"megatron_lm": megatron_lm} if megatron_lm else {})}


def source_checkout(module: str) -> dict[str, str] | None:
    """The git checkout a module is imported from (Megatron-LM on PYTHONPATH, as `parity bisect` runs it): its
    tree and commit; None for an installed package or a tree outside git."""
    import importlib.util
    import subprocess

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    where = spec and (spec.origin or next(iter(spec.submodule_search_locations or []), None))
    if not where or "site-packages" in Path(where).parts:
        return None
    try:
        done = subprocess.run(["git", "-C", str(Path(where).parent), "rev-parse", "--show-toplevel", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split()
    return {"tree": lines[0], "commit": lines[1]} if done.returncode == 0 and len(lines) == 2 else None


def cann_version() -> str | None:
    """The CANN toolkit's version as its install describes it (`version=` in ascend_toolkit_install.info, under
    ASCEND_TOOLKIT_HOME, which CANN's set_env.sh exports); None where it cannot be read."""
    home = Path(os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend/ascend-toolkit/latest")
    for info in [*sorted(home.glob("*/ascend_toolkit_install.info")), home / "ascend_toolkit_install.info"]:
        with contextlib.suppress(OSError):
            for line in info.read_text().splitlines():
                if line.startswith("version="):
                    return line.partition("=")[2].strip()
    return None


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG): ranks hold
    devices and ports, and a harness killed with -9 runs no cleanup. `parent` is the pid the caller expects as
    its parent; if it is gone already (it died before the signal was armed), exit now. No-op off Linux."""
    if sys.platform != "linux":
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def exit_after(record_dir: str | Path, rank: int, fn: Any, *args: Any) -> None:
    """Run a rank body; on any exception print it, write the rank's failure marker (time first: the launcher
    names the rank that died first), and exit HARD (no barrier, no atexit) so peers are not left waiting in a
    collective and the launcher sees a non-zero exit at once. A body that returns writes the done marker: an exit
    without either is a death too (parity.harness.run.deaths)."""
    try:
        fn(*args)
    except BaseException as exc:
        failure_marker(record_dir, rank).write_text(f"{time.time()!r}\n{type(exc).__name__}: {exc}"[:2000])
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    done_marker(record_dir, rank).touch()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    """torchrun entry: ranks read RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* from the environment."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job", type=Path, required=True)
    args = parser.parse_args(argv)
    job = RunJob.from_file(args.job)
    env = os.environ
    rank = int(env["RANK"])
    die_with_parent(os.getppid())  # torchrun: a torchrun killed with -9 cannot stop its workers itself
    # torchrun starts each worker in a session of its own: the launcher kills it by this pid, not torchrun's group
    (Path(job.record_dir) / f"rank{rank}.pid").write_text(str(os.getpid()))
    exit_after(job.record_dir, rank, job.rank_body(), job, rank, int(env["WORLD_SIZE"]),
               int(env.get("LOCAL_RANK", 0)), None)


if __name__ == "__main__":
    main()
