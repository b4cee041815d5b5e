"""Scenario files -> expanded, schema-checked Scenarios.

A file has `defaults` (merged under every entry) and `matrix` (a list of entries). In an entry, a list given
for one of the AXES expands as a cross product (like Megatron-LM's recipe `products`); lists elsewhere
(marks, faults) are plain values. Every error names the file, the entry/scenario and the key.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from parity.harness.config.errors import ScenarioError
from parity.harness.config.registry import (
    ALIASES,
    BASELINES,
    RETIRED,
    SPECS,
    engine_import_problem,
    import_path,
    third_party_spec,
    verl_vocabulary,
)
from parity.harness.contract.config_tree import did_you_mean
from parity.harness.contract.renames import RENAMED_KEYS
from parity.harness.contract.schema import Scenario

AXES = ("model", "strategy", "engine", "layout", "dtype", "device", "reference", "baseline")
TOP_LEVEL_KEYS = ("defaults", "matrix", "description")


def load_files(paths: list[Path]) -> list[Scenario]:
    scenarios: list[Scenario] = []
    seen: dict[str, str] = {}
    for path in paths:
        for scenario in load_file(path):
            if scenario.id in seen:
                raise ScenarioError(f"duplicate scenario id (also in {seen[scenario.id]}); give one a 'name'",
                                    file=str(path), scenario=scenario.id)
            seen[scenario.id] = str(path)
            scenarios.append(scenario)
    return scenarios


def load_file(path: Path) -> list[Scenario]:
    file = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario file: {exc.strerror}", file=file) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"YAML syntax error{line}: {problem}", file=file) from None
    if not isinstance(data, dict):
        raise ScenarioError("a scenario file must be a mapping with 'defaults' and 'matrix'", file=file)
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise ScenarioError(f"unknown top-level key{did_you_mean(key, TOP_LEVEL_KEYS)}", file=file, key=key)
    defaults = data.get("defaults") or {}
    entries = data.get("matrix") or []
    if not isinstance(defaults, dict):
        raise ScenarioError("'defaults' must be a mapping", file=file, key="defaults")
    if not isinstance(entries, list):
        raise ScenarioError("'matrix' must be a list of entries", file=file, key="matrix")
    scenarios = []
    for index, entry in enumerate(entries):
        label = f"matrix[{index}]"
        if not isinstance(entry, dict):
            raise ScenarioError("a matrix entry must be a mapping", file=file, scenario=label)
        for raw in expand(deep_merge(defaults, entry)):
            scenarios.append(parse_scenario(raw, file=file, label=label))
    return scenarios


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def expand(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Cross product over the AXES whose value is a list."""
    axes = [key for key in AXES if isinstance(entry.get(key), list)]
    if not axes:
        return [entry]
    combos = itertools.product(*(entry[key] for key in axes))
    return [{**entry, **dict(zip(axes, combo, strict=True))} for combo in combos]


def _label(raw: dict[str, Any], fallback: str) -> str:
    parts = [str(raw.get(k)) for k in ("model", "strategy", "engine", "layout", "dtype") if raw.get(k)]
    return f"{fallback} ({', '.join(parts)})" if parts else fallback


def parse_scenario(raw: dict[str, Any], *, file: str, label: str) -> Scenario:
    """One expanded entry -> Scenario, with renamed names and typos turned into clear errors."""
    where = {"file": file, "scenario": _label(raw, label)}
    for old, (new, why) in RENAMED_KEYS.items():
        for block, prefix in ((raw, ""), (raw.get("verl") if isinstance(raw.get("verl"), dict) else {}, "verl.")):
            if old in block:
                raise ScenarioError(f"'{old}' was renamed to '{new}': {why}. Run `parity migrate {file}`.",
                                    key=prefix + old, **where)
    raw = translate_verl(raw, where)
    strategy = raw.get("strategy")
    if isinstance(strategy, str) and strategy in ALIASES:
        raw = {**raw, "strategy": ALIASES[strategy]}
    elif isinstance(strategy, str) and strategy not in SPECS:
        if strategy in RETIRED:
            new, why = RETIRED[strategy]
            raise ScenarioError(f"strategy '{strategy}' is now '{new}' ({why}); run `parity migrate {file}`",
                                key="strategy", **where)
        raise ScenarioError(f"unknown strategy '{strategy}'{did_you_mean(strategy, SPECS)}; known: "
                            f"{', '.join(SPECS)} (or 'engine: package.module:Class')", key="strategy", **where)
    baseline = raw.get("baseline")
    if baseline is not None and baseline not in BASELINES:
        raise ScenarioError(f"got {baseline!r}: unknown baseline{did_you_mean(str(baseline), BASELINES)}; known: "
                            f"{', '.join(BASELINES)}", key="baseline", **where)
    raw = prepare(raw, where)
    try:
        scenario = Scenario.model_validate({**raw, "source": file})
    except ValidationError as exc:
        raise _from_validation(exc, where) from None
    return scenario


def translate_verl(raw: dict[str, Any], where: dict[str, str]) -> dict[str, Any]:
    """A `verl:` block through verl's vocabulary (engines/verl/vocabulary.py), its refusals as bad input."""
    vocabulary = verl_vocabulary()
    try:
        return vocabulary.translate(raw, where)
    except vocabulary.RefusedKey as exc:
        raise ScenarioError(str(exc), key=exc.key, **where) from None


def prepare(raw: dict[str, Any], where: dict[str, str]) -> dict[str, Any]:
    """The engine's own preparation of its raw mapping (EngineSpec.prepare), when it has one. A third-party
    engine's spec is imported here (and torch with it) only for a row that carries a block some engine prepares:
    listing and validating the other rows stays torch-free."""
    strategy, engine = raw.get("strategy"), raw.get("engine")
    spec = SPECS.get(strategy) if isinstance(strategy, str) else None
    if (spec is None and isinstance(engine, str) and ":" in engine and raw.get("actor_rollout_ref")
            and engine_import_problem(engine) is None):
        spec = third_party_spec(engine)
    if spec is None or spec.prepare is None:
        return raw
    prepared, problems = import_path(spec.prepare)(raw)
    if problems:
        key, message = problems[0]
        raise ScenarioError(message, key=key, **where)
    return prepared


def _from_validation(exc: ValidationError, where: dict[str, str]) -> ScenarioError:
    """The first pydantic error as one readable sentence, with did-you-mean for unknown keys."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc) or None
    if err["type"] == "extra_forbidden":
        known = _fields_at(Scenario, loc[:-1])
        return ScenarioError(f"unknown key{did_you_mean(loc[-1], known)}; allowed here: {', '.join(known)}",
                             key=key, **where)
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "literal_error":
        message = f"got {err.get('input')!r}: {message}" + did_you_mean(str(err.get("input")),
                                                                        _literal_choices(err))
    return ScenarioError(message, key=key, **where)


def _fields_at(model: type[BaseModel], path: list[str]) -> list[str]:
    for part in path:
        if part.isdigit():
            continue
        annotation = model.model_fields[part].annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is None:
            return []
        model = nested
    return [name for name in model.model_fields if name != "source"]


def _literal_choices(err: Any) -> list[str]:
    expected = (err.get("ctx") or {}).get("expected", "")
    return [part.strip(" '\"") for part in expected.replace(" or ", ",").split(",") if part.strip()]
