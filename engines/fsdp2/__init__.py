"""The `fsdp2` family: a transformers model under torch FSDP2, with Ulysses sequence parallel (`ulysses`) or
2-D FSDP x TP (`tensor_parallel`)."""
