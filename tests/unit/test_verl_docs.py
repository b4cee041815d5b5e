"""docs/verl.md mirrors the verl code's tables: every device shim (engines/verl/shims.py) and every key the harness
reads back (engines/verl/keys.py) is documented, and the docs name no shim the code does not have. Torch-free."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

DOC = (REPO / "docs" / "verl.md").read_text()


def _shim_names() -> set[str]:
    """The names of the Shim(...) constants, read from the module's source (importing it would import verl)."""
    tree = ast.parse((REPO / "engines" / "verl" / "shims.py").read_text())
    return {ast.literal_eval(node.value.args[0]) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "Shim"}


def test_every_shim_is_in_the_docs_table_and_no_other():
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \| ", DOC.split("## Device shims", 1)[1], flags=re.M))
    assert documented == _shim_names()


def test_the_fresh_optimizer_state_shim_is_what_the_megatron_engine_records():
    """One stand-in (engines/megatron/compat.py allocate_optimizer_state), one name in both records."""
    from parity.engines.megatron.compat import FRESH_OPTIMIZER_STATE

    assert FRESH_OPTIMIZER_STATE in _shim_names()


def _documented_keys() -> list[str]:
    """The backticked keys in the first column of the read-back tables ('clip_ratio*' and '*_parallel_size' are
    patterns; a key without a dot names the last part of a key)."""
    section = DOC.split("## What is read back", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\| ([^|]+) \| ", section, flags=re.M)
    return [key for cell in cells for key in re.findall(r"`([^`]+)`", cell)]


def test_every_key_read_back_is_documented():
    from fnmatch import fnmatch

    from parity.engines.verl.keys import FSDP, MEGATRON

    patterns = _documented_keys()
    missing = [key for table in (FSDP, MEGATRON) for key in table.read_back
               if not any(fnmatch(key if "." in pattern else key.rsplit(".", 1)[-1], pattern) or
                          (pattern.endswith(".*") and key.startswith(pattern[:-1])) for pattern in patterns)]
    assert missing == []
