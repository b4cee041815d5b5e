# The emulated torch_npu under site/ must never be imported by accident: pytest must not collect it.
collect_ignore = ["site"]
