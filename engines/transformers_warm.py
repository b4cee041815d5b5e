"""Imported by the forkserver after transformers (harness/config/registry.py, preload_modules): transformers builds
its checkpoint conversion table for every architecture it knows (~950 rules, each compiling regexes) on a process's
first `from_pretrained`, most of an fsdp2 rank's setup. Built once here, every forked rank inherits it.
Importing this module is the switch, as for parity.harness.run.rank_warnings."""

from __future__ import annotations

import contextlib

with contextlib.suppress(ImportError):  # transformers < 5 has no conversion table
    from transformers import conversion_mapping

    # transformers/conversion_mapping.py: get_checkpoint_conversion_mapping fills the module-level
    # _checkpoint_conversion_mapping_cache on its first call and deep-copies entries out of it afterwards
    conversion_mapping.get_checkpoint_conversion_mapping("llama")
