"""The Megatron engines' checkpoint check: megatron-core's dist-ckpt writer against the installed torch / numpy,
read from source text (planted texts here: a writer of each age, a torch of each age)."""

from __future__ import annotations

import pytest

from parity.engines.megatron import dist_ckpt_env

pytestmark = pytest.mark.torch_free

NEW_TORCH = "def _write_item(\n    transforms, stream, data, write_item, storage_key,\n    serialization_format,\n):"
OLD_TORCH = "def _write_item(stream, data, write_item, storage_key):"
OLD_WRITER = "_write_item(*transform_list, stream, data, write_item, storage_key)"
NEW_WRITER = "_write_item(*transform_list, stream, data, write_item, storage_key, serialization_format)"
OLD_MAPPING = "mask = np.zeros(np.product(self.local_shape), dtype=bool)"


def _plant(monkeypatch, writer: str, torch_writer: str, mapping: str = "np.prod(shape)") -> None:
    texts = {"core/dist_checkpointing/strategies/filesystem_async.py": writer,
             "core/dist_checkpointing/mapping.py": mapping, "distributed/checkpoint/filesystem.py": torch_writer}
    monkeypatch.setattr(dist_ckpt_env, "_source", lambda package, relative: texts[relative])


def test_an_old_writer_on_a_new_torch_is_named(monkeypatch):
    _plant(monkeypatch, OLD_WRITER, NEW_TORCH)
    assert "without serialization_format" in dist_ckpt_env.dist_ckpt_problem()


def test_a_writer_of_the_torchs_age_passes(monkeypatch):
    _plant(monkeypatch, NEW_WRITER, NEW_TORCH)
    assert dist_ckpt_env.dist_ckpt_problem() is None
    _plant(monkeypatch, OLD_WRITER, OLD_TORCH)
    assert dist_ckpt_env.dist_ckpt_problem() is None


def test_np_product_is_named_only_where_numpy_lacks_it(monkeypatch):
    _plant(monkeypatch, NEW_WRITER, NEW_TORCH, OLD_MAPPING)
    monkeypatch.delattr(dist_ckpt_env.numpy, "product", raising=False)
    assert "np.product" in dist_ckpt_env.dist_ckpt_problem()
    monkeypatch.setattr(dist_ckpt_env.numpy, "product", lambda shape: 0, raising=False)
    assert dist_ckpt_env.dist_ckpt_problem() is None


def test_nothing_installed_is_no_problem(monkeypatch):
    monkeypatch.setattr(dist_ckpt_env, "_source", lambda package, relative: None)
    assert dist_ckpt_env.dist_ckpt_problem() is None
