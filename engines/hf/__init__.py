"""The `hf` family: a transformers model in one process (the reference engine) and the HF loading, scheduling and
checkpoint code the other transformers-based engines share (`common`)."""
