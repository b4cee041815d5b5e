"""A planted verl Megatron engine (tests/multiproc/test_verl_megatron.py): verl's MegatronEngineWithLMHead, subclassed
to drop one `override_transformer_config` key silently before it builds the TransformerConfig (as a renamed or
forgotten key would be dropped), registered in verl's EngineRegistry under a device key of its own, so the
candidate is still built by `EngineRegistry.new` through verl's config and driven through verl's engine API. Its
clean twin registers the same subclass without dropping anything. The harness must FAIL the first naming the key
and PASS the second."""

from __future__ import annotations

from typing import ClassVar

from parity.engines.verl.megatron import VerlMegatronEngine

#: the key the planted engine drops: a TransformerConfig field with no effect on this workload's numbers
#: (pipeline outputs are deallocated only between pipeline stages), so only the read-back can see the drop
DROPPED = "deallocate_pipeline_outputs"


def _register(device: str, drop: str | None) -> None:
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.megatron import MegatronEngineWithLMHead

    if device in EngineRegistry._engines["language_model"]["megatron"]:
        return

    class PlantedMegatronEngine(MegatronEngineWithLMHead):
        def _build_tf_config(self) -> None:
            overrides = self.engine_config.override_transformer_config
            kept = overrides.pop(drop, None) if drop else None
            try:
                super()._build_tf_config()
            finally:
                if drop and kept is not None:
                    overrides[drop] = kept  # the config still says it: only what verl built lacks it

    EngineRegistry.register(model_type="language_model", backend="megatron", device=device)(PlantedMegatronEngine)


class _PlantedVerlEngine(VerlMegatronEngine):
    drop: ClassVar[str | None] = None

    def before_build(self) -> None:
        super().before_build()
        _register(self.engine_device, self.drop)


class DropsOneKeyEngine(_PlantedVerlEngine):
    engine_device: ClassVar[str] = "planted-drops-key"
    drop: ClassVar[str | None] = DROPPED


class CleanTwinEngine(_PlantedVerlEngine):
    engine_device: ClassVar[str] = "planted-clean-twin"
