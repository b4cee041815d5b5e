"""parity-harness, installed under ONE import name: `parity.harness`, `parity.engines`, `parity.reports`,
`parity.examples` map onto the repository's folders `harness/`, `engines/`, `reports/`, `parity_examples/`
(package-dir mapping in pyproject.toml), so nothing generic lands at the top level of a user's site-packages."""
