"""The docs tables that mirror code are checked against it, so they cannot drift: docs/scenarios.md's scenario fields
(with the layout and workload keys) and fault kinds against the schema, README's commands against the CLI's one
parser, docs/tolerances.md's defaults against the lanes' limits, docs/engines.md's spec fields against EngineSpec,
README's layout block against the folders, and the one torch pin against every install command. Each comparison
is also run on a planted drift that it must catch. Torch-free (docs/verl.md has its own: test_verl_docs.py)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import get_args

import pytest

from parity.harness.cli import build_parser
from parity.harness.contract.schema import FaultKind, Layout, Scenario, Workload
from parity.harness.contract.spec import EngineSpec
from parity.harness.judge.tolerances import DEFAULTS, Limits
from tests.conftest import REPO

SCENARIOS_MD = (REPO / "docs" / "scenarios.md").read_text()
README = (REPO / "README.md").read_text()


def section(text: str, heading: str) -> str:
    """The text under the first heading that starts with `heading`, up to the next heading of any level."""
    start = re.search(rf"^#+ {re.escape(heading)}.*$", text, flags=re.M)
    assert start is not None, f"no heading {heading!r}"
    rest = text[start.end():]
    end = re.search(r"^#+ ", rest, flags=re.M)
    return rest[:end.start()] if end else rest


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row in `text` (header and separator rows left out; `\\|` is a pipe)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or re.fullmatch(r"\|[-| :]+\|", line):
            continue
        rows.append([cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows[1:] if rows else rows


def first_table(text: str) -> str:
    """The first markdown table in `text`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def drift(documented: set[str], actual: set[str]) -> list[str]:
    return [f"not in the docs: {name}" for name in sorted(actual - documented)] + \
           [f"in the docs only: {name}" for name in sorted(documented - actual)]


# ---- docs/scenarios.md -------------------------------------------------------------------------------------------

def _fields_table(doc: str) -> dict[str, str]:
    return {row[0]: row[1] for row in table_rows(section(doc, "Fields"))}


def documented_fields(doc: str) -> set[str]:
    return {name for cell in _fields_table(doc) for name in ticked(cell)}


def documented_keys(doc: str, field: str) -> set[str]:
    """The keys listed in a field's row as one backticked run (`dp tp pp ...`), annotations in parentheses aside."""
    listed = ticked(_fields_table(doc)[f"`{field}`"])[0]
    return set(re.sub(r"\([^()]*\)", "", listed).split())


def documented_faults(doc: str) -> set[str]:
    """The fault kinds of the `faults` row and of every "Faults of ..." section's table (the packed data path's, the
    schedule's and checkpoint's)."""
    kinds = {name for name in ticked(_fields_table(doc)["`faults`"]) if re.fullmatch(r"[a-z_0-9]+", name)}
    kinds -= {"kind", "step", "rank", "factor", "key"}  # the row names the Fault fields first: `{kind, step, ...}`
    headings = re.findall(r"^#+ (Faults of .*)$", doc, flags=re.M)
    assert headings, "no 'Faults of ...' section"
    return kinds | {ticked(row[0])[0] for heading in headings for row in table_rows(section(doc, heading))}


def test_every_scenario_field_is_in_the_fields_table():
    assert drift(documented_fields(SCENARIOS_MD), set(Scenario.model_fields) - {"source"}) == []


@pytest.mark.parametrize(("field", "model"), [("layout", Layout), ("workload", Workload)])
def test_every_layout_and_workload_key_is_listed(field, model):
    assert drift(documented_keys(SCENARIOS_MD, field), set(model.model_fields)) == []


def test_every_fault_kind_is_documented():
    assert drift(documented_faults(SCENARIOS_MD), set(get_args(FaultKind))) == []


def test_a_fault_kind_added_to_the_schema_but_not_the_docs_fails():
    kinds = set(get_args(FaultKind))
    assert drift(documented_faults(SCENARIOS_MD), kinds | {"bias_skip"}) == ["not in the docs: bias_skip"]
    dropped = SCENARIOS_MD.replace("`mask_shift`, ", "")
    assert drift(documented_faults(dropped), kinds) == ["not in the docs: mask_shift"]


# ---- README: commands and layout ---------------------------------------------------------------------------------

def parser_commands() -> set[str]:
    """Every `parity` command the parser has, verbs of a command with subcommands included ('golden record')."""
    def commands(parser, prefix: str) -> set[str]:
        found = set()
        for action in parser._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for name, sub in action.choices.items():
                    below = commands(sub, f"{prefix}{name} ")
                    found |= below or {f"{prefix}{name}"}
        return found

    return commands(build_parser(), "")


def documented_commands(readme: str) -> set[str]:
    """The commands of README's table: `parity golden record FILE ...` -> 'golden record', each verb of
    `parity golden verify DIR` / `parity golden diff OLD NEW` in its cell's text too."""
    found = set()
    for row in table_rows(section(readme, "Commands")):
        for usage in ticked(row[0]) + ticked(row[1]):
            words = usage.split()
            if words[:1] != ["parity"] or len(words) < 2:
                continue
            verb = words[2] if len(words) > 2 and re.fullmatch(r"[a-z]+", words[2]) else None
            found.add(f"{words[1]} {verb}" if words[1] == "golden" and verb else words[1])
    return found


def test_every_command_of_the_parser_is_in_the_readme_and_no_other():
    assert drift(documented_commands(README), parser_commands()) == []


def test_a_command_left_out_of_the_readme_fails():
    without = "\n".join(line for line in README.splitlines() if not line.startswith("| `parity engines"))
    assert drift(documented_commands(without), parser_commands()) == ["not in the docs: engines"]


def test_the_layout_block_names_every_package_folder_and_only_folders_that_exist():
    block = README.split("## Layout", 1)[1].split("```", 2)[1]
    named = {line.split()[0].rstrip("/") for line in block.splitlines() if line and not line.startswith(" ")}
    assert [path for path in sorted(named) if "*" not in path and not (REPO / path).exists()] == []
    packages = {str(p.parent.relative_to(REPO)) for root in ("harness", "engines", "reports")
                for p in (REPO / root).glob("*/__init__.py")}
    packages = {p for p in packages if not p.startswith("engines/")}  # engine packages: the engines/ line names them
    assert sorted(packages - named) == []


# ---- docs/tolerances.md: the defaults ----------------------------------------------------------------------------

def documented_limits(doc: str) -> dict[str, dict[str, float | None]]:
    """key -> dtype -> value of the Defaults table ('—' = not checked: None)."""
    rows = table_rows(section(doc, "Defaults"))
    return {ticked(row[1])[0]: {dtype: None if cell == "—" else float(cell)
                                for dtype, cell in zip(("fp32", "bf16", "fp16"), row[2:5], strict=True)}
            for row in rows}


def limits_drift(documented: dict[str, dict[str, float | None]]) -> list[str]:
    problems = drift(set(documented), set(Limits.model_fields))
    for name, values in documented.items():
        for dtype, value in values.items():
            if name in Limits.model_fields and value != getattr(DEFAULTS[dtype], name):
                problems.append(f"{name} {dtype}: docs {value}, code {getattr(DEFAULTS[dtype], name)}")
    return problems


def test_the_defaults_table_is_the_lanes_limits():
    assert limits_drift(documented_limits((REPO / "docs" / "tolerances.md").read_text())) == []


def test_a_default_changed_in_code_but_not_in_the_docs_fails():
    documented = documented_limits((REPO / "docs" / "tolerances.md").read_text())
    documented["kl_k3"]["fp32"] = 1e-8
    del documented["ratio_max"]
    assert limits_drift(documented) == ["not in the docs: ratio_max", "kl_k3 fp32: docs 1e-08, code 1e-09"]
    assert all(v is None or math.isfinite(v) for row in documented.values() for v in row.values())


# ---- docs/engines.md: the spec's fields --------------------------------------------------------------------------

def test_every_engine_spec_field_is_in_the_engines_table():
    rows = table_rows(first_table(section((REPO / "docs" / "engines.md").read_text(), "The engine spec")))
    documented = {name for row in rows for name in ticked(row[0])}
    assert drift(documented, {f.name for f in dataclasses.fields(EngineSpec)}) == []


# ---- the torch pin -----------------------------------------------------------------------------------------------

PIN = re.compile(r"torch\s*==\s*\d")
READERS = ["README.md", "docs/verl.md", "tox.ini", "ci/install_cpu.sh", "ci/constraints-cpu.txt",
           "ci/constraints-verl.txt", "ci/constraints-megatron012.txt", "ci/constraints-vllm.txt"]


def pins(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if PIN.search(line) and not line.lstrip().startswith("#")]


def test_torch_is_pinned_once_and_every_install_reads_that_pin():
    assert len(pins(REPO / "ci" / "torch.txt")) == 1
    others = [*READERS, ".ci/run", *(str(p.relative_to(REPO)) for p in (REPO / ".github" / "workflows").glob("*"))]
    assert {name: pins(REPO / name) for name in others if pins(REPO / name)} == {}
    assert [name for name in READERS if "torch.txt" not in (REPO / name).read_text()] == []


def test_a_second_torch_pin_is_found(tmp_path):
    planted = tmp_path / "tox.ini"
    planted.write_text("commands_pre =\n    # torch==2.13.0 in a comment is prose\n    pip install torch==2.12.0\n")
    assert pins(planted) == ["    pip install torch==2.12.0"]
