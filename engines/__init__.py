"""Engines: one module per backend, all behind `engines.base.Engine`."""
