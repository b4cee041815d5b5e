"""Renderers: verdict JSON (one dict per scenario, as in results.jsonl) -> tables and files."""
