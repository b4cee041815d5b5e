"""`parity plan`: what each scenario would launch — world size, nodes, the torchrun command per node, card
assignment, environment and a per-rank memory estimate against the card's HBM — printed without running, so a
reviewer can check an Ascend job before it spends runner hours."""

from __future__ import annotations

import ipaddress
import os
import shlex
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from parity.harness.config import paths
from parity.harness.config.devices import DEVICE_KINDS
from parity.harness.config.errors import ScenarioError
from parity.harness.config.memory import plan_for
from parity.harness.config.validate import skip_reason
from parity.harness.contract.schema import Scenario
from parity.harness.run.launch import (
    INTERFACE_VARS,
    NODE_IFNAME,
    InterfaceError,
    NodeInterface,
    node_interface,
    torchrun_commands,
)

PLACEHOLDER_PORT = 29500


@dataclass(frozen=True, slots=True)
class NodePlan:
    node: int
    cards: tuple[int, ...]
    env: dict[str, str]
    torchrun: list[str]
    parity_run: list[str]
    interface: dict[str, str] = field(default_factory=dict)
    """Multi-node: what this node's launcher adds for its ranks (INTERFACE_VARS); `<...>` where only that node
    can tell."""
    this_host: str = ""
    """Multi-node: what a launcher on this host would set, or why it cannot tell."""


def _all_on_this_host(master_addr: str) -> bool:
    """A loopback master: every node runs on this host (the CPU rehearsal), so what is derived here is theirs."""
    try:
        return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback
                   for info in socket.getaddrinfo(master_addr, None))
    except (socket.gaierror, UnicodeError, ValueError):
        return False


def here(master_addr: str, port: int, environ: Mapping[str, str] = os.environ) -> NodeInterface | str:
    """What the launcher of a node on this host would set, or why it cannot tell. A PARITY_NODE_IFNAME naming no
    interface here is bad input: the launcher would refuse every multi-node run."""
    if master_addr.startswith("$"):
        return f"give --master-addr (not {master_addr}) to see what a launcher here would set"
    try:
        return node_interface(master_addr, port, environ)
    except InterfaceError as exc:
        if environ.get(NODE_IFNAME) and NODE_IFNAME in str(exc):
            raise ScenarioError(f"{exc}; the launcher refuses every multi-node run on this host") from None
        return str(exc)


def _interface_env(node: int, master_addr: str, derived: NodeInterface | str) -> dict[str, str]:
    if isinstance(derived, NodeInterface) and _all_on_this_host(master_addr):
        return dict(derived.env)
    placeholders = {"HCCL_IF_IP": f"<node {node}'s address toward {master_addr}>"}
    return {var: placeholders.get(var, "<its interface>") for var in INTERFACE_VARS}


def plan_scenario(scenario: Scenario, source: str, out_dir: Path, master_addr: str, port: int,
                  first_card: int = 0, environ: Mapping[str, str] = os.environ) -> list[NodePlan]:
    """Per node: the cards its ranks get (contiguous from first_card), the environment, the commands; for a
    multi-node layout, the interface variables its launcher adds (harness/run/launch.py node_interface, read
    with this host's `environ`)."""
    layout = scenario.layout
    kind = DEVICE_KINDS[scenario.device]
    job_file = paths.record_dir(out_dir, scenario.id) / paths.JOB
    commands = torchrun_commands(layout, job_file, master_addr, port, paths.slug(scenario.id), python="python")
    plans = []
    derived = here(master_addr, port, environ) if layout.nodes > 1 else ""
    this_host = derived.describe() if isinstance(derived, NodeInterface) else derived
    for node in range(layout.nodes):
        cards = tuple(range(first_card, first_card + layout.ranks_per_node)) if scenario.device != "cpu" else ()
        env = dict(kind.determinism_env)
        if kind.visible_env and cards:
            env[kind.visible_env] = ",".join(map(str, cards))
        run = ["parity", "run", source, "-k", scenario.id, "--device", scenario.device, "--out", str(out_dir)]
        if layout.nodes > 1:
            run += ["--node-rank", str(node), "--master-addr", master_addr, "--master-port", str(port)]
        interface = _interface_env(node, master_addr, derived) if layout.nodes > 1 else {}
        plans.append(NodePlan(node, cards, env, commands[node], run, interface, this_host))
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
                  *([f"    interface env (its launcher; a value the runner sets is kept): "
                     f"{' '.join(f'{k}={v}' for k, v in plan.interface.items())}"] if plan.interface else []),
                  f"    run: {shlex.join(plan.parity_run)}",
                  f"    torchrun: {shlex.join(plan.torchrun)}"]
    if plans and plans[0].this_host:
        lines.append(f"  this host: {plans[0].this_host} ({NODE_IFNAME} names the interface)")
    if reason := skip_reason(scenario):
        lines.append(f"  here: would SKIP ({reason})")
    return "\n".join(lines)

