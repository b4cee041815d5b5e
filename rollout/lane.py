"""The rollout lane: `python -m parity.rollout FILE... [--out DIR]`, run in the vLLM venv (ci/constraints-vllm.txt).

One vLLM engine per (model, dtype), started once and reused by every row that names them. Per row:
1. back to the checkpoint's weights (vLLM's load_weights of the checkpoint itself), then seeded sampling of each
   row's response from the workload's seeded prompts, with the sampled tokens' log-probs;
2. the fp32 reference (plain transformers on the checkpoint) scores the sampled tokens at the sampling temperature;
3. the trainer, in its own venv (PARITY_TRAINER_PYTHON, or PARITY_VERL_PYTHON for verl's engines), scores the
   rollout's sequences, trains on them and exports its weights to a file (rollout/trainer.py);
4. vLLM loads the exported tensors (with the row's planted faults) through its load_weights and scores the same
   sequences; rollout/judge.py judges.
Writes results.jsonl and summary.md under --out and prints the table; exit 1 when a row FAILs or ERRORs, 2 on bad
input. The script guards `if __name__ == "__main__"`: vLLM starts its engine in spawned processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

#: the interpreter of each trainer lane, by whether the trainer is one of verl's engines (it reads verl's config)
TRAINER_PYTHON = {False: "PARITY_TRAINER_PYTHON", True: "PARITY_VERL_PYTHON"}
RESULTS, SUMMARY = "results.jsonl", "summary.md"


def trainer_python(row: Any) -> tuple[str | None, str]:
    """(interpreter, the variable naming it) for this row's trainer."""
    from parity.harness.config.registry import spec_for

    variable = TRAINER_PYTHON["actor_rollout_ref" in spec_for(row.trainer).kwargs_blocks]
    return os.environ.get(variable) or None, variable


def rollout_batch(batch: Any, responses: list[list[int]]) -> Any:
    """The workload's batch with each row's response replaced by the rollout's tokens (same lengths)."""
    input_ids = batch.input_ids.clone()
    for i, tokens in enumerate(responses):
        input_ids[i, batch.prompt_len:batch.prompt_len + len(tokens)] = input_ids.new_tensor(tokens)
    return replace(batch, input_ids=input_ids * batch.attention_mask)


def sequences(batch: Any) -> list[list[int]]:
    """Each row's real tokens (prompt then response), as vLLM takes them."""
    return [row[mask.bool()].tolist() for row, mask in zip(batch.input_ids, batch.attention_mask, strict=True)]


def response_grid(batch: Any, per_row: list[list[float]]) -> Any:
    """[B, R] response-aligned values from per-row lists over the response tokens."""
    import torch

    out = torch.zeros(batch.response_mask.shape, dtype=torch.float64)
    for i, values in enumerate(per_row):
        out[i, :len(values)] = torch.tensor(values, dtype=torch.float64)
    return out


def reference_logprobs(checkpoint: Path, batch: Any, temperature: float) -> Any:
    """The fp32 reference's log-probs of the response tokens at a temperature: plain transformers, nothing shared
    with vLLM or any trainer."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits.double()
    p = batch.prompt_len
    scores = torch.log_softmax(logits[:, p - 1:-1] / temperature, dim=-1)
    return scores.gather(-1, batch.input_ids[:, p:, None])[..., 0] * batch.response_mask


def run_trainer(row: Any, work: Path, batch_file: Path, cache_dir: Path) -> dict[str, Any]:
    python, variable = trainer_python(row)
    if python is None:
        return {"status": "skip", "reason": f"{variable} is not set: the python of the trainer's venv "
                                            "(docs/rollout.md)"}
    job = work / "trainer_job.json"
    job.write_text(json.dumps({"scenario": row.trainer.model_dump(mode="json"), "out": str(work),
                               "batch": str(batch_file), "steps": row.sync_after_steps,
                               "cache_dir": str(cache_dir.resolve()), "timeout": row.timeout}))
    try:
        proc = subprocess.run([python, "-m", "parity.rollout.trainer", str(job)], capture_output=True, text=True,
                              timeout=row.timeout + 120)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"the trainer's process ran past {row.timeout + 120:g} s"}
    result_file = work / "trainer_result.json"
    if not result_file.is_file():
        return {"status": "error", "error": f"the trainer's process exited {proc.returncode} without a result",
                "log_tail": (proc.stdout + proc.stderr)[-3000:]}
    return json.loads(result_file.read_text())


class Lane:
    """The engines of one lane run, started on first use and reused."""

    def __init__(self, out: Path, cache_dir: Path) -> None:
        self.out, self.cache_dir = out, cache_dir
        self.engines: dict[tuple[str, str], Any] = {}

    def engine(self, row: Any, checkpoint: Path) -> Any:
        from parity.rollout.vllm.engine import VllmRollout

        trainer = row.trainer
        key = (trainer.model, trainer.dtype, trainer.device)
        if key not in self.engines:
            self.engines[key] = VllmRollout(checkpoint, trainer.dtype, device=trainer.device,
                                            logprobs_mode="processed_logprobs",
                                            max_model_len=trainer.workload.seq_len + 8,
                                            memory_fraction=row.sampling.memory_fraction)
        return self.engines[key]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()

    def run_row(self, row: Any) -> Any:
        import torch
        from safetensors.torch import load_file, save_file

        from parity.harness.config.models import ensure_checkpoint, model_shape
        from parity.harness.config.paths import slug
        from parity.harness.contract.workload import build_batch
        from parity.rollout.faults import Attention, plant
        from parity.rollout.judge import RolloutVerdict, judge
        from parity.rollout.trainer import EXPORT_FILE, TRAINER_FILE, save_batch
        from parity.rollout.vllm.engine import missing

        if (reason := missing(row.trainer.device)) is not None:
            return RolloutVerdict(row.id, "SKIP", [reason])
        timings: dict[str, float] = {}
        work = self.out / "rows" / slug(row.id)
        work.mkdir(parents=True, exist_ok=True)
        checkpoint = ensure_checkpoint(row.trainer.model, self.cache_dir)
        config = json.loads((checkpoint / "config.json").read_text())
        workload = row.trainer.workload
        t0 = time.perf_counter()
        vllm = self.engine(row, checkpoint)
        timings["engine_start_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        vllm.load_weights(checkpoint / "model.safetensors")  # an earlier row left its trainer's weights
        seeded = build_batch(workload, model_shape(row.trainer.model).vocab_size)
        lengths = seeded.response_mask.sum(dim=1).tolist()
        prompts = [s[:len(s) - n] for s, n in zip(sequences(seeded), lengths, strict=True)]
        temperature_fault = any(f.kind == "rollout_temperature_not_applied" for f in row.faults)
        previous = vllm.set_logprobs_mode("raw_logprobs") if temperature_fault else None
        try:
            generated = vllm.generate(prompts, lengths, row.sampling.temperature, row.sampling.seed)
        finally:
            if previous is not None:
                vllm.set_logprobs_mode(previous)
        batch = rollout_batch(seeded, [g.tokens for g in generated])
        sampled = response_grid(batch, [g.logprobs for g in generated])
        rollout_at_1 = sampled if row.sampling.temperature == 1.0 else self._scores(vllm, batch)
        timings["rollout_s"] = time.perf_counter() - t0
        reference = reference_logprobs(checkpoint, batch, row.sampling.temperature)
        batch_file = work / "rollout_batch.pt"
        save_batch(batch, batch_file)
        t0 = time.perf_counter()
        trainer = run_trainer(row, work, batch_file, self.cache_dir)
        timings["trainer_s"] = time.perf_counter() - t0
        info: dict[str, Any] = {"timings": timings, "trainer": {k: v for k, v in trainer.items() if k != "log_tail"}}
        if trainer["status"] == "skip":
            return RolloutVerdict(row.id, "SKIP", [trainer["reason"]], info=info)
        if trainer["status"] != "ok":
            return RolloutVerdict(row.id, "ERROR", [f"trainer {trainer['status']}: {trainer.get('error')}",
                                                    trainer.get("log_tail") or ""], info=info)
        scores = torch.load(work / TRAINER_FILE)
        exported = load_file(str(work / EXPORT_FILE))
        info["exported_dtypes"] = sorted({str(t.dtype) for t in exported.values()})
        attention = Attention(config["num_attention_heads"], config["num_key_value_heads"],
                              config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
        delivered = work / "delivered.safetensors"
        save_file(plant(exported, row.faults, attention), str(delivered))
        t0 = time.perf_counter()
        info["loaded_tensors"] = vllm.load_weights(delivered)
        synced = self._scores(vllm, batch)
        timings["sync_and_score_s"] = time.perf_counter() - t0
        return judge(row, batch.response_mask, rollout_at_1=rollout_at_1, sampled=sampled,
                     reference_sampled=reference, trainer_before=scores["before"], trainer_after=scores["after"],
                     synced=synced, info=info)

    @staticmethod
    def _scores(vllm: Any, batch: Any) -> Any:
        """vLLM's log-probs of each row's response tokens at temperature 1."""
        lengths = batch.response_mask.sum(dim=1).tolist()
        per_row = vllm.score(sequences(batch))
        return response_grid(batch, [s[len(s) - n:] for s, n in zip(per_row, lengths, strict=True)])


def main(argv: list[str] | None = None) -> int:
    from parity.harness.config.errors import ScenarioError
    from parity.harness.config.paths import CACHE
    from parity.rollout.judge import RolloutVerdict
    from parity.rollout.report import render, render_spread, write
    from parity.rollout.schema import load_rollout_file

    parser = argparse.ArgumentParser(prog="python -m parity.rollout", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("parity-out/rollout"))
    parser.add_argument("--cache-dir", type=Path, default=CACHE)
    parser.add_argument("-k", dest="keyword", help="only rows whose id contains this")
    parser.add_argument("--run-broken", action="store_true",
                        help="run the rows marked broken too (their verdicts do not decide the exit code)")
    args = parser.parse_args(argv)
    try:
        rows = [row for file in args.files for row in load_rollout_file(file)]
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = [r for r in rows if args.keyword is None or args.keyword in r.id]
    args.out.mkdir(parents=True, exist_ok=True)
    by_engine = defaultdict(list)
    for row in rows:  # rows of one engine together: it starts once
        by_engine[(row.trainer.model, row.trainer.dtype, row.trainer.device)].append(row)
    lane = Lane(args.out, args.cache_dir)
    verdicts = []
    started = time.perf_counter()
    try:
        for group in by_engine.values():
            for row in group:
                t0 = time.perf_counter()
                if row.broken and not args.run_broken:
                    verdict = RolloutVerdict(row.id, "SKIP", [f"broken: {row.broken}"])
                else:
                    try:
                        verdict = lane.run_row(row)
                    except Exception as exc:  # one row's crash is that row's ERROR, never the others' results
                        verdict = RolloutVerdict(row.id, "ERROR", [f"{type(exc).__name__}: {exc}"])
                verdict.info |= {"dtype": row.trainer.dtype, "faults": [f.kind for f in row.faults]}
                if row.broken:
                    verdict.info["broken"] = row.broken
                verdict.info["wall_s"] = time.perf_counter() - t0
                verdicts.append(verdict)
                print(f"[{len(verdicts)}/{len(rows)}] {verdict.status:5} {row.id} {verdict.info['wall_s']:.1f}s",
                      *(f"\n    {r}" for r in verdict.reasons), flush=True)
                write(args.out, verdicts)
    finally:
        lane.close()
    print(render(verdicts))
    if text := render_spread(verdicts):
        print(text)
    counts = {s: sum(v.status == s and not v.info.get("broken") for v in verdicts)
              for s in ("PASS", "FAIL", "ERROR", "SKIP")}
    print(f"{len(verdicts)} rollout rows in {time.perf_counter() - started:.1f} s: "
          + ", ".join(f"{n} {s.lower()}" for s, n in counts.items())
          + f", {sum(bool(v.info.get('broken')) for v in verdicts)} broken")
    return 1 if counts["FAIL"] or counts["ERROR"] else 0
