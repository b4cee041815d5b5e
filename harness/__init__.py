"""Backend-parity harness: YAML scenarios -> real engine runs -> parity verdicts."""
