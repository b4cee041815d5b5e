"""Worked examples of third-party engines that scenarios name by import path (see docs/engines.md)."""
