"""The trainer's side of a rollout row, run in the trainer's own venv (`python -m parity.rollout.trainer JOB`).

The trainer is any engine of the matrix (the scenario's strategy, verl's engines included), launched with the
harness's launcher, on the rollout's sequences (a Batch file the vLLM lane wrote):
1. score them (Engine.forward): the actor's log-probs of the rollout's tokens;
2. train `steps` steps on them (Engine.train_step, the old log-probs being its own first scores, as an actor
   update does), and score them again;
3. export its weights as a trainer hands them to the rollout:
   - verl's engines: `engine.get_per_tensor_param()` of verl's FSDP / Megatron engine (HF names, FSDP's full
     tensors, mbridge's TP gather and q/k/v / gate-up split) — what verl's checkpoint engine streams to vLLM;
   - the harness's engines: their own checkpoint (Engine.save_checkpoint) converted to HF by their own converter
     (Engine.convert_checkpoint): the only HF export they have.
   Rank 0 writes the tensors, as exported (dtype included), to one safetensors file.
Every rank runs every step: the exports gather over the ranks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

TRAINER_FILE = "trainer_logprobs.pt"
EXPORT_FILE = "exported.safetensors"
RESULT_FILE = "trainer_result.json"


def trainer_rank(job: Any, rank: int, world_size: int, local_rank: int, store: Any | None) -> None:
    """Rank body (RunJob.body) of the trainer's launch."""
    import torch
    import torch.distributed as dist

    from parity.harness.config.models import ensure_checkpoint
    from parity.harness.config.registry import load_engine_class
    from parity.harness.contract.engine import EngineContext
    from parity.harness.contract.faults import FaultPlan
    from parity.harness.contract.schema import Scenario
    from parity.harness.run.worker import _broadcast, checked_step, checked_tokens, join_process_group

    scenario = Scenario.model_validate(job.scenario)
    args = job.body_args
    _, device = join_process_group(scenario, rank, world_size, local_rank, store)
    checkpoint = ensure_checkpoint(scenario.model, Path(job.cache_dir))
    ctx = EngineContext(scenario=scenario, checkpoint=checkpoint, rank=rank, world_size=world_size,
                        local_rank=local_rank, device=device, faults=FaultPlan((), rank))
    engine = load_engine_class(scenario)(ctx)
    engine.setup()
    batch = load_batch(Path(args["batch"]))
    expected = tuple(batch.response_mask.shape)
    before = checked_tokens(engine.forward(batch), rank, expected, "forward (rollout's tokens)")
    old = _broadcast(before.logprobs if before is not None else None, rank)
    losses = []
    for step in range(1, int(args["steps"]) + 1):
        out = engine.train_step(batch, old, step)
        if rank == 0:
            losses.append(checked_step(out, step))
    after = checked_tokens(engine.forward(batch), rank, expected, "forward (after training)")
    out_dir = Path(args["out"])
    exporter = export_weights(engine, ctx, out_dir)
    engine.teardown()
    if rank == 0:
        torch.save({"before": before.logprobs.cpu(), "after": after.logprobs.cpu()}, out_dir / TRAINER_FILE)
        (out_dir / "trainer_meta.json").write_text(json.dumps(
            {"exporter": exporter, "losses": losses, "effective_dtype": engine.effective_dtype()}))
    dist.barrier()


def export_weights(engine: Any, ctx: Any, out_dir: Path) -> str:
    """Write the trainer's weights, as its exporter hands them over, to out_dir/EXPORT_FILE (rank 0); returns
    which exporter ran."""
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file

    per_tensor = getattr(getattr(engine, "engine", None), "get_per_tensor_param", None)
    if per_tensor is not None:
        params, _peft_config = per_tensor()
        tensors = {}
        for name, tensor in params:  # every rank iterates: the FSDP full_tensor / mbridge gathers are collectives
            if ctx.rank == 0:
                tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()
        if ctx.rank == 0:
            save_file(tensors, str(out_dir / EXPORT_FILE))
        dist.barrier()
        return f"{type(engine.engine).__module__}.{type(engine.engine).__name__}.get_per_tensor_param"
    checkpoint_dir, hf_dir = out_dir / "engine_checkpoint", out_dir / "engine_hf"
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    engine.save_checkpoint(checkpoint_dir)
    dist.barrier()
    if ctx.rank == 0:
        type(engine).convert_checkpoint(checkpoint_dir, hf_dir, ctx.checkpoint, ctx.faults)
        tensors = {}
        for file in sorted(hf_dir.glob("*.safetensors")):
            tensors.update(load_file(str(file)))
        save_file(tensors, str(out_dir / EXPORT_FILE))
    dist.barrier()
    return f"{type(engine).__name__}.save_checkpoint + convert_checkpoint"


def save_batch(batch: Any, path: Path) -> None:
    import torch

    torch.save({"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                "position_ids": batch.position_ids, "response_mask": batch.response_mask,
                "advantages": batch.advantages, "prompt_len": batch.prompt_len}, path)


def load_batch(path: Path) -> Any:
    import torch

    from parity.harness.contract.workload import Batch

    return Batch(**torch.load(path))


def run(job_file: Path) -> dict[str, Any]:
    """Launch the trainer's ranks for one row; the outcome as a dict (also written to RESULT_FILE)."""
    from parity.harness.config.registry import spec_for
    from parity.harness.config.validate import skip_reason
    from parity.harness.contract.schema import Scenario
    from parity.harness.run.launch import ForkedLauncher
    from parity.harness.run.preload import forkserver_preload
    from parity.harness.run.worker import RunJob

    spec = json.loads(job_file.read_text())
    scenario = Scenario.model_validate(spec["scenario"])
    out_dir = Path(spec["out"])
    reason = skip_reason(scenario)
    if reason is not None:
        result: dict[str, Any] = {"status": "skip", "reason": reason}
    else:
        record_dir = out_dir / "ranks"
        job = RunJob(run_id=f"rollout-trainer:{scenario.id}", scenario=scenario.model_dump(mode="json"),
                     record_dir=str(record_dir), cache_dir=spec["cache_dir"], provenance={},
                     body="parity.rollout.trainer:trainer_rank",
                     body_args={"batch": spec["batch"], "steps": spec["steps"], "out": str(out_dir)})
        launcher = ForkedLauncher(*forkserver_preload([scenario]))
        started = time.perf_counter()
        try:
            launched = launcher.launch(job, scenario.layout.world_size, spec["timeout"])
        finally:
            launcher.close()
        result = {"status": launched.status, "error": launched.error, "log_tail": launched.log_tail,
                  "wall_time_s": time.perf_counter() - started, "engine": spec_for(scenario).name}
        meta = out_dir / "trainer_meta.json"
        if launched.status == "ok" and meta.is_file():
            result |= json.loads(meta.read_text())
        elif launched.status == "ok":
            result |= {"status": "error", "error": "the trainer's ranks exited 0 without writing their results"}
    (out_dir / RESULT_FILE).write_text(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path)
    result = run(parser.parse_args(argv).job)
    return 0 if result["status"] in ("ok", "skip") else 1


if __name__ == "__main__":
    sys.exit(main())
