"""`parity plan`: what each scenario would launch — world size, nodes, the torchrun command per node, card
assignment, environment and a per-rank memory estimate against the card's HBM — printed without running, so a
reviewer can check an Ascend job before it spends runner hours."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from parity.harness.config import paths
from parity.harness.config.devices import DEVICE_KINDS
from parity.harness.config.memory import plan_for
from parity.harness.config.validate import skip_reason
from parity.harness.contract.schema import Scenario
from parity.harness.run.launch import torchrun_commands

PLACEHOLDER_PORT = 29500


@dataclass(frozen=True, slots=True)
class NodePlan:
    node: int
    cards: tuple[int, ...]
    env: dict[str, str]
    torchrun: list[str]
    parity_run: list[str]


def plan_scenario(scenario: Scenario, source: str, out_dir: Path, master_addr: str, port: int,
                  first_card: int = 0) -> list[NodePlan]:
    """Per node: the cards its ranks get (contiguous from first_card), the environment, the commands."""
    layout = scenario.layout
    kind = DEVICE_KINDS[scenario.device]
    job_file = paths.record_dir(out_dir, scenario.id) / paths.JOB
    commands = torchrun_commands(layout, job_file, master_addr, port, paths.slug(scenario.id), python="python")
    plans = []
    for node in range(layout.nodes):
        cards = tuple(range(first_card, first_card + layout.ranks_per_node)) if scenario.device != "cpu" else ()
        env = dict(kind.determinism_env)
        if kind.visible_env and cards:
            env[kind.visible_env] = ",".join(map(str, cards))
        run = ["parity", "run", source, "-k", scenario.id, "--device", scenario.device, "--out", str(out_dir)]
        if layout.nodes > 1:
            run += ["--node-rank", str(node), "--master-addr", master_addr, "--master-port", str(port)]
        plans.append(NodePlan(node, cards, env, commands[node], run))
    return plans


def render(scenario: Scenario, plans: list[NodePlan]) -> str:
    lay = scenario.layout
    lines = [scenario.id,
             f"  world size {lay.world_size} = dp({lay.dp}) * tp({lay.tp}) * pp({lay.pp}) * cp({lay.cp}) * "
             f"ulysses({lay.ulysses}); vpp {lay.vpp}, ep {lay.ep}, etp {lay.etp}, sequence_parallel "
             f"{lay.sequence_parallel}; {lay.nodes} node(s) x {lay.ranks_per_node} ranks; "
             f"backend {DEVICE_KINDS[scenario.device].backend}"]
    memory = plan_for(scenario)
    lines.append(f"  memory: {memory.render()}" if memory else
                 f"  memory: unknown (no config.json for {scenario.model} here; a directory with the model's "
                 "config.json is enough)")
    for plan in plans:
        cards = ",".join(map(str, plan.cards)) or "none (cpu)"
        lines += [f"  node {plan.node}: cards {cards}",
                  f"    env: {' '.join(f'{k}={v}' for k, v in plan.env.items()) or '-'}",
                  f"    run: {shlex.join(plan.parity_run)}",
                  f"    torchrun: {shlex.join(plan.torchrun)}"]
    if reason := skip_reason(scenario):
        lines.append(f"  here: would SKIP ({reason})")
    return "\n".join(lines)

