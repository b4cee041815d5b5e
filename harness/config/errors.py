"""User-facing input errors: always name the file, the scenario and the key, never show a traceback."""

from __future__ import annotations


class ScenarioError(ValueError):
    """Bad scenario input. The CLI prints it as one paragraph and exits with code 2."""

    def __init__(self, message: str, *, file: str | None = None, scenario: str | None = None,
                 key: str | None = None) -> None:
        self.file, self.scenario, self.key, self.detail = file, scenario, key, message
        super().__init__(self.render())

    def render(self) -> str:
        where = [f"file {self.file}" if self.file else None,
                 f"scenario {self.scenario}" if self.scenario else None,
                 f"key '{self.key}'" if self.key else None]
        prefix = ", ".join(w for w in where if w)
        return f"{prefix}: {self.detail}" if prefix else self.detail

    def located(self, *, file: str | None = None, scenario: str | None = None) -> ScenarioError:
        """The same error with the location filled in where it was missing."""
        return ScenarioError(self.detail, file=self.file or file, scenario=self.scenario or scenario,
                             key=self.key)
