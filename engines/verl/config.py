"""verl's own config for a scenario, made the way verl makes it: its trainer config composed by Hydra from verl's
own config directory (verl/trainer/config), the scenario's `actor_rollout_ref` keys merged over it, and verl's
dataclasses built from that with verl's `omega_conf_to_dataclass` (their `__post_init__` checks run). Nothing of
verl's defaults is restated here.

Used twice: by validation in the harness process (a key verl would reject is bad input, exit 2) and by the
engine in each rank. Imports verl: call only where verl can be imported (engines/verl/source.py).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.engines.verl import source
from parity.engines.verl.keys import BLOCK


@dataclass(frozen=True, slots=True)
class VerlConfigs:
    model: Any
    """verl.workers.config.HFModelConfig"""
    actor: Any
    """verl.workers.config.FSDPActorConfig / McoreActorConfig (its `.engine` is the engine config)"""
    defaults: Mapping[str, Any]
    """verl's composed default for every flat key the scenario gives (None where verl has no such key)."""
    tree: Any = None
    """verl's whole trainer config (OmegaConf) the dataclasses were built from: what verl's worker and trainer
    read."""


class VerlConfigError(ValueError):
    """A key or value verl's config rejects; `key` is the flat key under actor_rollout_ref."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def compose(config_name: str) -> Any:
    """verl's trainer config with its defaults (Hydra compose of verl/trainer/config/<config_name>.yaml): a copy
    of this process's one composition per config directory and name (Hydra reads and merges some hundred YAML
    files each time; validating a scenario file composed once per row)."""
    from omegaconf import OmegaConf

    root = source.package_dir()
    if root is None:
        raise RuntimeError("verl is not importable here")
    return OmegaConf.create(_composed(str(root / "trainer" / "config"), config_name))


@functools.cache
def _composed(config_dir: str, config_name: str) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name=config_name)


def merged(config_name: str, flat: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """verl's composed trainer config with the scenario's flat keys merged in (each checked to exist), and verl's
    default for each of those keys."""
    from omegaconf import OmegaConf

    cfg = compose(config_name)
    tree = cfg[BLOCK]
    for key in flat:
        check_key(tree, key)
    defaults = {key: _default(tree, key) for key in flat}
    OmegaConf.set_struct(cfg, False)
    for key, value in flat.items():
        OmegaConf.update(tree, key, value, merge=False)
    return cfg, defaults


def build(config_name: str, flat: Mapping[str, Any], checkpoint: str | Path) -> VerlConfigs:
    """The scenario's flat keys over verl's defaults -> verl's model and actor dataclasses."""
    cfg, defaults = merged(config_name, flat)
    tree = cfg[BLOCK]
    tree.model.path = str(checkpoint)
    if not _has_tokenizer(Path(checkpoint)):
        tree.model.load_tokenizer = False  # a tiny checkpoint has none; verl would fail to load it
    return VerlConfigs(model=_dataclass(tree, "model"), actor=_dataclass(tree, "actor"), defaults=defaults, tree=cfg)


def validate(config_name: str, flat: Mapping[str, Any]) -> dict[str, Any]:
    """Before anything runs: every key exists in verl's config, the actor section builds (verl's own checks run)
    and the model section has the types verl's HFModelConfig declares (building it would load the checkpoint).
    Returns verl's default for each key; raises VerlConfigError."""
    from omegaconf import OmegaConf

    cfg, defaults = merged(config_name, flat)
    tree = cfg[BLOCK]
    _dataclass(tree, "actor")
    model_class = _target_class(tree.model)
    if model_class is not None:
        try:
            OmegaConf.merge(OmegaConf.structured(model_class), tree.model)
        except Exception as exc:
            raise VerlConfigError(_failing_key(exc, "model"), f"verl rejects it: {_message(exc)}") from None
    return defaults


def _dataclass(tree: Any, section: str) -> Any:
    from verl.utils.config import omega_conf_to_dataclass

    try:
        return omega_conf_to_dataclass(tree[section])
    except Exception as exc:
        raise VerlConfigError(_failing_key(exc, section), f"verl rejects it: {_message(exc)}") from None


def check_key(tree: Any, key: str) -> None:
    """Raise VerlConfigError for a key verl's config does not have. Below a node that has a `_target_` (one of
    verl's dataclasses) a key must be a field of that dataclass; below a dict-typed field any key goes (verl's
    `override_transformer_config`, `mixed_precision`, ...), as in verl's own structured merge."""
    node: Any = tree
    parts = key.split(".")
    for depth, part in enumerate(parts):
        target = _target_class(node)
        if target is not None:
            fields = {f.name: f for f in dataclasses.fields(target)}
            if part not in fields:
                raise VerlConfigError(key, f"verl's {target.__name__} has no field '{part}'"
                                           f"{_did_you_mean(part, fields)}")
            if _is_open_mapping(target, fields[part]):
                return
        elif not _is_mapping(node) or part not in node:
            where = ".".join(parts[:depth]) or BLOCK
            raise VerlConfigError(key, f"verl's config has no key '{part}' under {where}")
        node = node[part] if _is_mapping(node) and part in node else None
        if node is None and depth < len(parts) - 1:
            raise VerlConfigError(key, f"'{'.'.join(parts[:depth + 1])}' is not a section of verl's config")


def _target_class(node: Any) -> type | None:
    if not _is_mapping(node) or "_target_" not in node:
        return None
    from hydra.utils import get_class

    cls = get_class(node["_target_"])
    return cls if dataclasses.is_dataclass(cls) else None


def _is_mapping(node: Any) -> bool:
    from omegaconf import DictConfig

    return isinstance(node, (DictConfig, Mapping))


def _is_open_mapping(owner: type, field: dataclasses.Field) -> bool:
    """Whether a dataclass field is a free-form mapping (dict, Optional[dict], Any), not a nested dataclass."""
    try:
        hint = typing.get_type_hints(owner).get(field.name, field.type)
    except Exception:
        hint = field.type
    options = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    return any(option is Any or option is dict or typing.get_origin(option) in (dict, Mapping) for option in options)


def _default(tree: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(tree, key, throw_on_missing=False)
    except Exception:
        return None
    return OmegaConf.to_container(value, resolve=True) if _is_mapping(value) or isinstance(value, list) else value


def _has_tokenizer(checkpoint: Path) -> bool:
    return any((checkpoint / name).exists() for name in ("tokenizer.json", "tokenizer_config.json",
                                                         "tokenizer.model", "vocab.json"))


def _failing_key(exc: BaseException, section: str) -> str:
    full_key = getattr(exc, "full_key", None) or getattr(getattr(exc, "__cause__", None), "full_key", None)
    if full_key:
        return str(full_key).removeprefix(f"{BLOCK}.")
    return section


def _message(exc: BaseException) -> str:
    """verl's own message: the innermost cause (Hydra wraps a dataclass's ValueError / AssertionError)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line for line in str(exc).strip().splitlines() if not line.startswith(("full_key:", "object_type="))]
    return " ".join(lines) or type(exc).__name__


def _did_you_mean(word: str, choices: Mapping[str, Any]) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
