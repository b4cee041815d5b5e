"""Rewrite historic names in scenario files in place, comments kept (`parity migrate FILE...`; with `--check` it
only reports, a CI gate). Both say which verl version's
vocabulary each `verl:` block uses (engines/verl/vocabulary.py)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.harness.config.errors import ScenarioError
from parity.harness.config.registry import RETIRED, verl_vocabulary
from parity.harness.contract.renames import RENAMED_KEYS


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    """Where in the YAML tree, e.g. matrix[2].llm_kwargs."""
    old: str
    new: str


def migrate_tree(node: Any, path: str = "") -> list[Change]:
    """Rename old keys and strategy values in a ruamel round-trip tree, in place."""
    changes: list[Change] = []
    if isinstance(node, dict):
        for key in list(node.keys()):
            if key in RENAMED_KEYS:
                new_key = RENAMED_KEYS[key][0]
                if new_key in node:
                    raise ScenarioError(f"both '{key}' and '{new_key}' are given; merge them by hand",
                                        key=f"{path}{key}")
                position = list(node.keys()).index(key)
                node.insert(position, new_key, node.pop(key))
                changes.append(Change(f"{path}{key}", key, new_key))
                key = new_key
            value = node[key]
            if key == "strategy":
                changes += _rename_strategy(node, key, value, f"{path}{key}")
            else:
                changes += migrate_tree(value, f"{path}{key}.")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            changes += migrate_tree(item, f"{path.rstrip('.')}[{index}].")
    return changes


def _rename_strategy(node: Any, key: str, value: Any, path: str) -> list[Change]:
    if isinstance(value, str) and value in RETIRED:
        node[key] = RETIRED[value][0]
        return [Change(path, value, node[key])]
    if isinstance(value, list):
        changes = []
        for index, item in enumerate(value):
            if isinstance(item, str) and item in RETIRED:
                value[index] = RETIRED[item][0]
                changes.append(Change(f"{path}[{index}]", item, value[index]))
        return changes
    return []


def verl_blocks(tree: Any) -> list[tuple[str, str]]:
    """(where, vocabulary) of every `verl:` block in a scenario file tree (read before it is migrated)."""
    defaults = tree.get("defaults") if isinstance(tree, dict) else None
    device = defaults.get("device") if isinstance(defaults, dict) else None
    entries = tree.get("matrix") if isinstance(tree, dict) else None
    found = []
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(entry, dict) and isinstance(entry.get("verl"), dict):
            found.append((f"matrix[{index}].verl",
                          verl_vocabulary().vocabulary(dict(entry["verl"]), entry.get("device", device))))
    return found


def migrate_file(path: Path, write: bool) -> list[Change]:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    try:
        tree = yaml.load(path.read_text())
    except (OSError, YAMLError) as exc:
        raise ScenarioError(f"cannot migrate: {exc}", file=str(path)) from None
    for where, words in verl_blocks(tree):
        print(f"{path}: {where}: {words}")
    try:
        changes = migrate_tree(tree)
    except ScenarioError as exc:
        raise exc.located(file=str(path)) from None
    if changes and write:
        buffer = io.StringIO()
        yaml.dump(tree, buffer)
        path.write_text(buffer.getvalue())
    return changes

