"""A rollout row: which trainer (any strategy the matrix knows, verl's engines included) and which rollout engine,
what the rollout samples, how many steps the trainer takes before its weights are synced, and planted faults.

A rollout file is its own YAML (scenarios/rollout/*.yaml, not collected by the default `pytest`): `defaults` and
`matrix` as in scenario files; each entry holds a `trainer:` mapping, which is a scenario of the main matrix
(parsed by the matrix's own parser, so every strategy, layout and verl key is validated as there), and the rollout
keys below. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from parity.harness.config.errors import ScenarioError
from parity.harness.config.matrix import deep_merge, parse_scenario
from parity.harness.config.registry import spec_for
from parity.harness.contract.config_tree import did_you_mean
from parity.harness.contract.schema import Scenario


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


RolloutEngine = Literal["vllm"]
SyncFaultKind = Literal["sync_layer_skipped", "sync_qk_swapped", "sync_tp_shard_duplicated",
                        "sync_tied_embedding_skipped", "sync_bf16", "rollout_temperature_not_applied"]


class Sampling(_Strict):
    """How the rollout engine samples the responses (vLLM's SamplingParams)."""

    temperature: float = Field(1.0, gt=0)
    """The rollout's sampling temperature; the log-probs it returns must be of the distribution it sampled from
    (verl's `rollout.logprobs_mode: processed_logprobs`), so a row with temperature != 1 tests that they are."""
    seed: int = 7
    """Per-request sampling seed (vLLM's SamplingParams.seed; row i uses seed + i)."""
    memory_fraction: float = Field(0.3, gt=0, lt=1)
    """On an accelerator: the share of card 0's memory vLLM takes (its gpu_memory_utilization), the rest being the
    trainer's, whose ranks share the cards with it (verl's colocated rollout). Ignored on CPU."""


class SyncFault(_Strict):
    """A planted defect of the weight sync or of the rollout engine; each must FAIL its row, naming the check."""

    kind: SyncFaultKind
    layer: int = 1
    """sync_layer_skipped / sync_tp_shard_duplicated: the decoder layer it hits (sync_qk_swapped hits all)."""
    shards: int = 2
    """sync_tp_shard_duplicated: the TP degree of the gathered weight (shard 0's rows written over shard 1's)."""


class RolloutTolerance(_Strict):
    """Limits per check; unset fields take the dtype default (rollout/judge.py, docs/tolerances.md)."""

    rollout_logprob_max_abs: float | None = None
    """Max |Δ log-prob| between the rollout's and the trainer's scores of the same tokens, before training."""
    sync_logprob_max_abs: float | None = None
    """Max |Δ log-prob| between vLLM's scores after the weight sync and the trained trainer's."""
    sampled_logprob_max_abs: float | None = None
    """Max |Δ| between the log-probs vLLM returns with its samples and the fp32 reference's at the row's
    temperature (plain transformers on the same weights)."""


class RolloutRow(_Strict):
    """One expanded rollout row."""

    trainer: Scenario
    rollout: RolloutEngine = "vllm"
    sampling: Sampling = Sampling()
    sync_after_steps: int = Field(2, ge=1)
    """Training steps the trainer takes on the rollout's sequences before its weights are synced to the rollout."""
    faults: tuple[SyncFault, ...] = ()
    tolerance: RolloutTolerance = RolloutTolerance()
    timeout: float = Field(300.0, gt=0)
    """Seconds the trainer's launch (setup, scoring, training, export) may take."""
    name: str | None = None
    broken: str | None = None
    """Known broken upstream: listed, and run only with --run-broken (which keeps its result apart); the reason."""

    @property
    def id(self) -> str:
        suffix = "".join(f"+{f.kind}" for f in self.faults) + (f"+{self.name}" if self.name else "")
        return f"{self.trainer.id}>{self.rollout}{suffix}"

    @model_validator(mode="after")
    def _check(self) -> RolloutRow:
        if self.trainer.faults or self.trainer.resume or self.trainer.convert or self.trainer.baseline:
            raise ValueError("the trainer of a rollout row takes no faults / resume / convert / baseline of its own "
                             "(rollout faults go in the row's `faults`)")
        if self.trainer.dtype not in ("fp32", "bf16"):
            raise ValueError(f"the rollout lane has limits for fp32 and bf16 (docs/tolerances.md), not "
                             f"{self.trainer.dtype}")
        for fault in self.faults:
            if fault.kind == "sync_bf16" and self.trainer.dtype != "fp32":
                raise ValueError(f"sync_bf16 plants a bf16 sync into an fp32 run; this trainer runs in "
                                 f"{self.trainer.dtype}")
            if fault.kind == "rollout_temperature_not_applied" and self.sampling.temperature == 1.0:
                raise ValueError("rollout_temperature_not_applied needs sampling.temperature != 1 (at 1 the raw "
                                 "and the processed log-probs coincide)")
        return self


TOP_LEVEL_KEYS = ("defaults", "matrix", "description")
ROW_KEYS = ("trainer", *(k for k in RolloutRow.model_fields if k != "trainer"))


def load_rollout_file(path: Path) -> list[RolloutRow]:
    """Rows of a rollout file; bad input raises ScenarioError naming file, row and key (exit 2 in the CLI)."""
    file = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ScenarioError(f"cannot read rollout file: {exc.strerror}", file=file) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"YAML syntax error: {str(exc).splitlines()[0]}", file=file) from None
    if not isinstance(data, dict):
        raise ScenarioError("a rollout file must be a mapping with 'defaults' and 'matrix'", file=file)
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise ScenarioError(f"unknown top-level key{did_you_mean(key, TOP_LEVEL_KEYS)}", file=file, key=key)
    defaults, entries = data.get("defaults") or {}, data.get("matrix") or []
    if not isinstance(defaults, dict) or not isinstance(entries, list):
        raise ScenarioError("'defaults' must be a mapping and 'matrix' a list", file=file)
    rows, seen = [], set()
    for index, entry in enumerate(entries):
        label = f"matrix[{index}]"
        if not isinstance(entry, dict):
            raise ScenarioError("a matrix entry must be a mapping", file=file, scenario=label)
        raw = deep_merge(defaults, entry)
        row = parse_row(raw, file=file, label=label)
        if row.id in seen:
            raise ScenarioError("duplicate rollout row id; give one a 'name'", file=file, scenario=row.id)
        seen.add(row.id)
        rows.append(row)
    return rows


def parse_row(raw: dict[str, Any], *, file: str, label: str) -> RolloutRow:
    for key in raw:
        if key not in ROW_KEYS:
            raise ScenarioError(f"unknown key{did_you_mean(key, ROW_KEYS)}", file=file, scenario=label, key=key)
    trainer_raw = raw.get("trainer")
    if not isinstance(trainer_raw, dict):
        raise ScenarioError("a rollout row needs a 'trainer' mapping (a scenario of the main matrix)", file=file,
                            scenario=label, key="trainer")
    trainer = parse_scenario(dict(trainer_raw), file=file, label=f"{label}.trainer")
    spec = spec_for(trainer)
    if "actor_rollout_ref" not in spec.kwargs_blocks and "convert" not in spec.checkpoints:
        raise ScenarioError(f"trainer '{spec.name}' has no export of its weights to HF names (neither verl's "
                            "get_per_tensor_param nor a checkpoint converter: EngineSpec.checkpoints lacks 'convert')",
                            file=file, scenario=label, key="trainer.strategy")
    try:
        return RolloutRow.model_validate({**raw, "trainer": trainer})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise ScenarioError(err["msg"], file=file, scenario=label, key=key or None) from None
