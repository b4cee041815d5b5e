"""verl-style config trees, nested and/or dotted, as one dotted key per leaf. Below the engines and the scenario
parsing both: the verl engines read their `actor_rollout_ref` tree with it (engines/verl/keys.py), and the
scenario's `verl:` block for the harness's own engines (engines/verl/blocks.py)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

#: the verl tree's root in the messages of engines/verl/keys.py
DEFAULT_ROOT = "actor_rollout_ref"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean 'x'?)' suffix when a close spelling exists, else ''."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def flatten(tree: Any, prefix: str = "", root: str = DEFAULT_ROOT) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A nested and/or dotted verl tree -> ({dotted key: leaf value}, [(where, problem)]). Mappings nest
    (dict-typed verl fields such as mixed_precision flatten to their keys); lists and empty mappings are leaves.
    `root` names the tree in the problems' keys."""
    flat: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    if not isinstance(tree, Mapping):
        return flat, [(f"{root}{prefix and '.' + prefix}", "must be a mapping of verl config keys")]
    for key, value in tree.items():
        if not isinstance(key, str) or not key:
            problems.append((f"{root}.{prefix}", f"config keys are strings, got {key!r}"))
            continue
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping) and value:
            inner, inner_problems = flatten(value, path, root)
            problems += inner_problems
            for leaf, leaf_value in inner.items():
                if leaf in flat:
                    problems.append((f"{root}.{leaf}", "given twice (nested and as a dotted key)"))
                flat[leaf] = leaf_value
        else:
            if path in flat:
                problems.append((f"{root}.{path}", "given twice (nested and as a dotted key)"))
            flat[path] = dict(value) if isinstance(value, Mapping) else value
    return flat, problems
