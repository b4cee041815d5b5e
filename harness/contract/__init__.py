"""The engine contract: what every engine implements and consumes (Engine, its context and outputs, the
workload batch, the shared loss, fault hooks, the engine spec, the scenario schema). Below both the engines and
the orchestration; imports nothing from either."""
