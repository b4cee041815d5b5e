"""Checks before anything launches.

Static checks (`check_scenario`) need only the scenario and the model's shape: a layout the model or the
engine cannot take is bad input (exit 2). Environment checks (`skip_reason`, `check_environment`) decide
whether a valid scenario can run on THIS machine: a missing device or package is a SKIP with a reason,
while a missing model path or too few cards for a scenario that would otherwise run is bad input.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

from harness import devices
from harness.errors import ScenarioError
from harness.models import ModelShape, expand_model_path, is_tiny, model_shape
from harness.schema import Scenario

#: what each built-in strategy implements of the layout
SUPPORTED_DIMS: dict[str, set[str]] = {
    "hf": set(),
    "fsdp2": {"dp", "ulysses"},
    "megatron": {"dp", "tp", "pp", "vpp", "cp", "ep", "etp", "sequence_parallel"},
    "mindspeed_megatron": {"dp", "tp", "pp", "vpp", "cp", "ep", "etp", "sequence_parallel"},
    "mindspeed_fsdp": {"dp", "tp", "ep", "ulysses"},  # its FSDP engine has no context-parallel attention
}

#: strategy -> "module:function(scenario, shape) -> list[(key, message)]" with engine-specific rules
ENGINE_RULES: dict[str, str] = {
    "megatron": "engines.megatron.rules:megatron_layout_errors",
    "mindspeed_megatron": "engines.megatron.rules:megatron_layout_errors",
}

#: strategy -> (importable module, what to tell the user when it is missing)
REQUIRED_PACKAGES: dict[str, list[tuple[str, str]]] = {
    "megatron": [("megatron.core", "megatron-core is not installed (pip install -e '.[megatron]')")],
    "mindspeed_megatron": [("megatron.core", "megatron-core is not installed"),
                           ("mindspeed", "the mindspeed package is not installed (it ships only in Ascend images)")],
    "mindspeed_fsdp": [("mindspeed", "the mindspeed package is not installed (it ships only in Ascend images)")],
}


def check_scenario(scenario: Scenario) -> None:
    """Raise ScenarioError for a layout that cannot work for this model and engine."""
    errors = layout_errors(scenario)
    if errors:
        key, message = errors[0]
        raise ScenarioError(message, file=scenario.source, scenario=scenario.id, key=key)


def layout_errors(scenario: Scenario) -> list[tuple[str, str]]:
    lay, wl = scenario.layout, scenario.workload
    errors: list[tuple[str, str]] = []
    if scenario.engine and (problem := engine_import_problem(scenario.engine)):
        errors.append(("engine", problem))
    if scenario.strategy in SUPPORTED_DIMS:
        used = {d for d in ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "ulysses") if getattr(lay, d) > 1}
        used |= {"sequence_parallel"} if lay.sequence_parallel else set()
        for dim in sorted(used - SUPPORTED_DIMS[scenario.strategy]):
            errors.append((f"layout.{dim}", f"strategy '{scenario.strategy}' does not implement {dim}; supported: "
                           f"{', '.join(sorted(SUPPORTED_DIMS[scenario.strategy])) or 'none (one rank)'}"))
    if scenario.strategy in ("mindspeed_megatron", "mindspeed_fsdp") and scenario.dtype == "fp32":
        errors.append(("dtype", f"{scenario.strategy} trains in bf16 or fp16 (as verl enforces for MindSpeed)"))
    if wl.batch_size % lay.dp:
        errors.append(("workload.batch_size", f"batch_size({wl.batch_size}) is not divisible by dp({lay.dp})"))
    if wl.seq_len % lay.ulysses:
        errors.append(("workload", f"sequence length {wl.seq_len} (prompt_len + response_len) is not divisible "
                                   f"by ulysses({lay.ulysses})"))
    if lay.cp > 1 and wl.seq_len % (2 * lay.cp):
        errors.append(("workload", f"sequence length {wl.seq_len} is not divisible by 2*cp({2 * lay.cp}) "
                                   "(load-balanced context parallel splits it into 2*cp chunks)"))
    if lay.sequence_parallel and wl.seq_len % lay.tp:
        errors.append(("workload", f"sequence length {wl.seq_len} is not divisible by tp({lay.tp}) "
                                   "(sequence parallel)"))
    shape = model_shape(scenario.model)
    if shape is not None:
        errors += _shape_errors(scenario, shape)
        rules = ENGINE_RULES.get(scenario.strategy or "")
        if rules and importlib.util.find_spec(rules.split(":")[0].rsplit(".", 1)[0]) is not None:
            errors += _load(rules)(scenario, shape)
    return errors


def engine_import_problem(path: str) -> str | None:
    """Why a third-party engine's module cannot be found (ranks search the working directory too)."""
    module = path.partition(":")[0]
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return None if found else (f"engine module '{module}' is not importable: install its package or run from "
                               "the directory that holds it")


def _shape_errors(scenario: Scenario, shape: ModelShape) -> list[tuple[str, str]]:
    lay = scenario.layout
    errors = []
    for dim in ("tp", "ulysses"):
        degree = getattr(lay, dim)
        if shape.num_heads % degree or shape.num_kv_heads % degree:
            errors.append((f"layout.{dim}", f"{dim}({degree}) must divide the attention heads ({shape.num_heads}) "
                                            f"and KV heads ({shape.num_kv_heads}) of {scenario.model}"))
    if lay.tp > 1 and lay.ulysses > 1 and shape.num_kv_heads % (lay.tp * lay.ulysses):
        errors.append(("layout.ulysses", f"tp({lay.tp}) * ulysses({lay.ulysses}) must divide the KV heads "
                                         f"({shape.num_kv_heads}) of {scenario.model}"))
    if shape.num_layers % (lay.pp * lay.vpp):
        errors.append(("layout.pp", f"{scenario.model} has {shape.num_layers} layers, not divisible by "
                                    f"pp({lay.pp}) * vpp({lay.vpp})"))
    if lay.ep > 1 and (shape.num_experts == 0 or shape.num_experts % lay.ep):
        errors.append(("layout.ep", f"ep({lay.ep}) must divide the number of experts ({shape.num_experts}) "
                                    f"of {scenario.model}"))
    return errors


def _load(path: str) -> Callable[..., list[tuple[str, str]]]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def skip_reason(scenario: Scenario) -> str | None:
    """Why this scenario cannot run here (None = it can). Never an error: an Ascend scenario on a CPU box
    is collected and skipped, saying what is missing."""
    if scenario.broken:
        return f"marked broken: {scenario.broken}"
    missing = []
    _, why = devices.availability(scenario.device)
    if why:
        missing.append(f"device {scenario.device}: {why}")
    for module, message in REQUIRED_PACKAGES.get(scenario.strategy or "", []):
        if importlib.util.find_spec(module.split(".")[0]) is None or (
                "." in module and importlib.util.find_spec(module) is None):
            missing.append(message)
    if missing and (problem := model_path_problem(scenario.model)):
        missing.append(problem)
    return "; ".join(missing) or None


def model_path_problem(model: str) -> str | None:
    """Why a checkpoint path cannot be used (None when it is a tiny model or an existing directory)."""
    if is_tiny(model):
        return None
    expanded = expand_model_path(model)
    if "$" in expanded:
        unset = [v.strip("${}") for v in expanded.split("/") if v.startswith("$")]
        return f"model path {model}: environment variable {', '.join(unset)} is not set"
    if not Path(expanded).is_dir():
        return f"model path {model} (expanded: {expanded}) is not a directory"
    return None


def check_environment(scenario: Scenario) -> None:
    """For a scenario that will run here: the model exists and there are enough devices."""
    where = {"file": scenario.source, "scenario": scenario.id}
    if problem := model_path_problem(scenario.model):
        raise ScenarioError(problem, key="model", **where)
    count, _ = devices.availability(scenario.device)
    if scenario.layout.ranks_per_node > count:
        raise ScenarioError(f"needs {scenario.layout.ranks_per_node} {scenario.device} ranks per node but only "
                            f"{count} are available", key="layout", **where)
    if scenario.reference.startswith("golden:"):
        golden = Path(expand_model_path(scenario.reference.removeprefix("golden:")))
        if not (golden / "record.json").is_file():
            raise ScenarioError(f"golden reference {golden} has no record.json", key="reference", **where)
