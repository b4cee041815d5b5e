"""Engines: one module per backend, all behind `parity.harness.contract.engine.Engine`."""
