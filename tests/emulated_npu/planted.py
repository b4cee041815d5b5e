"""A planted MindSpeed defect for the read-back test: the REAL MindSpeed, with the one function that feeds its
patched TransformerConfig.__init__ its args (`get_full_args` as mindspeed/core/megatron_basic/arguments_basic.py
calls it) wrapped so that one key never reaches the config — a MindSpeed that accepts a kwarg and ignores it.
The engine must read back what MindSpeed built and so report the key as not applied."""

from __future__ import annotations

import argparse
from typing import Any

from parity.engines.mindspeed.megatron import MindSpeedMegatronEngine

#: the kwarg the planted MindSpeed ignores (a MindSpeed-only arg no tp2 code path needs)
IGNORED = "cp_window_size"


class IgnoresOneKwargEngine(MindSpeedMegatronEngine):  # type: ignore[misc, valid-type]
    def prepare_megatron(self) -> None:
        super().prepare_megatron()
        from mindspeed.core.megatron_basic import arguments_basic

        real = arguments_basic.get_full_args

        def without_key() -> Any:
            kept = {k: v for k, v in vars(real()).items() if k != IGNORED}
            return argparse.Namespace(**kept)

        arguments_basic.get_full_args = without_key
