"""Emulated torch_npu.contrib."""
