"""Scenario configuration: YAML files -> validated Scenarios, the engine-spec registry, models and devices."""
