"""Strategy name or import path -> engine class. Imports lazily: an NPU engine's imports never run on CPU."""

from __future__ import annotations

import importlib
import os
import sys

from engines.base import Engine
from harness.names import STRATEGIES
from harness.schema import Scenario


def engine_path(scenario: Scenario) -> str:
    return scenario.engine or STRATEGIES[scenario.strategy or ""]


def load_engine_class(scenario: Scenario) -> type[Engine]:
    module_name, _, class_name = engine_path(scenario).partition(":")
    if os.getcwd() not in sys.path:  # third-party engines in the working tree, as pytest's rootdir would
        sys.path.append(os.getcwd())
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise TypeError(f"{engine_path(scenario)} is not a subclass of engines.base.Engine")
    return cls
