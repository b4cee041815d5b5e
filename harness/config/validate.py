"""Checks before anything launches.

Static checks (`check_scenario`) need only the scenario, its engine's spec and the model's shape: a layout the
model or the engine cannot take is bad input (exit 2). Environment checks (`skip_reason`, `check_environment`)
decide whether a valid scenario can run on THIS machine: a missing device or package is a SKIP with a reason,
while a missing model path or too few cards for a scenario that would otherwise run is bad input.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from parity.harness.config import devices
from parity.harness.config.errors import ScenarioError
from parity.harness.config.memory import plan_for
from parity.harness.config.models import expand_model_path, is_tiny, model_shape, unexpanded_variables
from parity.harness.config.paths import RECORD
from parity.harness.config.registry import check_environment as check_spec_environment
from parity.harness.config.registry import (
    checkpoint_problem,
    engine_import_problem,
    import_path,
    spec_for,
    upstream_defect,
)
from parity.harness.contract.parallel_dims import ParallelDims
from parity.harness.contract.schema import RL_STEP_FIELDS, Scenario
from parity.harness.contract.spec import KWARGS_BLOCKS, LAYOUT_DIMS, EngineSpec


def check_scenario(scenario: Scenario) -> None:
    """Raise ScenarioError for a layout that cannot work for this model and engine."""
    errors = layout_errors(scenario)
    if errors:
        key, message = errors[0]
        raise ScenarioError(message, file=scenario.source, scenario=scenario.id, key=key)
    check_memory(scenario)


class MemoryPlanWarning(UserWarning):
    """A scenario whose per-rank memory estimate exceeds the card's usable HBM (likely OOM)."""


def check_memory(scenario: Scenario) -> None:
    """On an accelerator: a per-rank estimate above the card's HBM is a warning (the estimate is coarse); states
    alone far above it (harness/config/memory.py IMPOSSIBLE_MULTIPLE) are bad input."""
    if scenario.device == "cpu" or scenario.broken or (plan := plan_for(scenario)) is None:
        return
    if plan.level == "impossible":
        raise ScenarioError(f"cannot fit: {plan.render()}", file=scenario.source, scenario=scenario.id, key="layout")
    if plan.level == "over":
        warnings.warn(f"{scenario.source}, scenario {scenario.id}: per-rank memory plan {plan.render()}",
                      MemoryPlanWarning, stacklevel=2)


def layout_errors(scenario: Scenario) -> list[tuple[str, str]]:
    lay, wl = scenario.layout, scenario.workload
    if scenario.engine and (problem := engine_import_problem(scenario.engine)):
        return [("engine", problem)]
    spec = spec_for(scenario)
    errors = spec_errors(scenario, spec)
    dims = ParallelDims.of(lay)
    errors += dims.batch_problems(wl.batch_size) + dims.sequence_problems(wl.seq_len, wl.packed)
    shape = model_shape(scenario.model)
    if shape is not None:
        errors += dims.model_problems(shape, scenario.model)
        if spec.rules:
            errors += import_path(spec.rules)(scenario, shape)
    if scenario.resume is not None and scenario.resume.layout is not None:  # the layout the run continues on
        moved = scenario.model_copy(update={"layout": scenario.resume.layout, "resume": None})
        errors += [(f"resume.{key}" if key.startswith("layout") else key, f"on resume.layout: {message}")
                   for key, message in layout_errors(moved)]
    return errors


def spec_errors(scenario: Scenario, spec: EngineSpec) -> list[tuple[str, str]]:
    """What the engine's spec says it cannot take: layout dimensions, kwargs blocks, dtype."""
    lay = scenario.layout
    errors: list[tuple[str, str]] = []
    used = {d for d in LAYOUT_DIMS if d != "sequence_parallel" and getattr(lay, d) > 1}
    used |= {"sequence_parallel"} if lay.sequence_parallel else set()
    for dim in sorted(used - spec.dims):
        errors.append((f"layout.{dim}", f"engine '{spec.name}' does not implement {dim}; supported: "
                                        f"{', '.join(sorted(spec.dims)) or 'none (one rank)'}"))
    for block in KWARGS_BLOCKS:
        if getattr(scenario, block) and block not in spec.kwargs_blocks:
            errors.append((block, f"engine '{spec.name}' does not read {block}; it reads "
                                  f"{', '.join(spec.kwargs_blocks) or 'no kwargs block'}"))
        for key in getattr(scenario, block):
            if key in spec.layout_keys:
                errors.append((f"{block}.{key}", f"set by the scenario's {spec.layout_keys[key]}, not by {block}"))
    if scenario.dtype not in spec.dtypes:
        errors.append(("dtype", f"engine '{spec.name}' trains in {', '.join(spec.dtypes)}, not {scenario.dtype}"))
    if (mode := scenario.workload.loss_agg_mode) not in spec.loss_agg_modes:
        errors.append(("workload.loss_agg_mode", f"engine '{spec.name}' aggregates the loss as "
                                                 f"{', '.join(spec.loss_agg_modes)}, not {mode}"))
    workload = scenario.workload
    for name in RL_STEP_FIELDS:
        if getattr(workload, name) != type(workload).model_fields[name].default and name not in spec.rl_step:
            errors.append((f"workload.{name}", f"engine '{spec.name}' does not implement verl's RL-step setting "
                                               f"{name} (it implements {', '.join(spec.rl_step) or 'none'})"))
    if (packing := scenario.workload.packing) not in spec.packings:
        errors.append(("workload.packing", f"engine '{spec.name}' feeds its rows {', '.join(spec.packings)}, not "
                                           f"{packing}"))
    for field, needs in (("resume", scenario.resume is not None), ("convert", scenario.convert)):
        if needs and field not in spec.checkpoints:
            errors.append((field, f"engine '{spec.name}' cannot {field} through its own checkpoint (its spec's "
                                  f"checkpoints: {', '.join(spec.checkpoints) or 'none'})"))
    return errors


def skip_reason(scenario: Scenario) -> str | None:
    """Why this scenario cannot run here (None = it can). Never an error: an Ascend scenario on a CPU box
    is collected and skipped, saying what is missing. A golden reference not recorded yet is one such reason
    (missing_golden); a run that requires its rows (--require) errors on it as on any other."""
    if scenario.broken:
        return f"marked broken: {scenario.broken}"
    missing = []
    _, why = devices.availability(scenario.device)
    if why:
        missing.append(f"device {scenario.device}: {why}")
    spec = spec_for(scenario)
    if scenario.device not in spec.devices and not _emulated(spec, scenario):
        missing.append(f"engine '{spec.name}' runs on {', '.join(spec.devices)}, not {scenario.device}")
    missing += spec.missing()
    if not missing and (problem := check_spec_environment(spec)):
        missing.append(problem)
    if not missing and (scenario.resume is not None or scenario.convert) and (problem := checkpoint_problem(spec)):
        missing.append(problem)
    if not missing and (defect := upstream_defect(spec, scenario)):
        return f"marked broken on this stack: {defect}"
    if missing and (problem := model_path_problem(scenario.model)):
        missing.append(problem)
    if problem := missing_golden(scenario):
        missing.append(problem)
    return "; ".join(missing) or None


#: how a golden is recorded: scenarios/goldens.yaml names each record directory after its scenario id (slug)
GOLDENS_FILE = "scenarios/goldens.yaml"
GOLDENS_WORKFLOW = ".github/workflows/goldens.yml"


NO_GOLDEN = "no golden"
"""How a reason for a row whose golden is absent begins: the reports and ci/nightly.sh count these rows (a night
that ran them against nothing must say so on its first screen, and not be green)."""


def missing_golden(scenario: Scenario) -> str | None:
    """A `golden:` reference whose record.json is absent: the row SKIPs (under --require, ERRORs) naming the golden
    and the command that records it; the other rows of the night run."""
    if not scenario.reference.startswith("golden:"):
        return None
    given = scenario.reference.removeprefix("golden:")
    expanded = expand_model_path(given)
    golden = Path(expanded)
    unset = unexpanded_variables(expanded)
    if not unset and (golden / RECORD).is_file():
        return None
    where = f"its directory variable {', '.join(unset)}" if unset else f"{golden} has no {RECORD}"
    run_id = golden.name.replace("__", "/")
    return (f"{NO_GOLDEN}: golden reference {given} is not recorded ({where}): record it on a CUDA runner with "
            f"`parity golden record {GOLDENS_FILE} -k '{run_id}' --device cuda --out goldens` ({GOLDENS_WORKFLOW}, "
            f"`gh workflow run goldens.yml -f k='{run_id}'`), then pin the release (PARITY_GOLDENS_TAG)")


def broken_here(scenario: Scenario) -> str | None:
    """Why the row is known broken: its `broken:` mark, or an upstream defect of the installed release it would
    hit (its engine's `upstream_defects`)."""
    if scenario.broken:
        return scenario.broken
    spec = spec_for(scenario)
    return upstream_defect(spec, scenario)


def _emulated(spec: EngineSpec, scenario: Scenario) -> bool:
    """An NPU-only engine may run with device cpu under the emulated torch_npu (tests/emulated_npu), never
    elsewhere."""
    return scenario.device == "cpu" and "npu" in spec.devices and devices.npu_emulated()


def model_path_problem(model: str) -> str | None:
    """Why a checkpoint path cannot be used (None when it is a tiny model or an existing directory)."""
    if is_tiny(model):
        return None
    expanded = expand_model_path(model)
    if unset := unexpanded_variables(expanded):
        return f"model path {model}: environment variable {', '.join(unset)}"
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
