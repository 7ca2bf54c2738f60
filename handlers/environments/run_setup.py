"""A `grandrounds run` over an environment's tasks (MedAgentBench, AgentClinic OSCE): the checked cases,
the record naming the environment in the run's spec, and how to open the environment for the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager


@dataclass
class EnvRunSetup:
    cases: list
    record: Any
    """The environment's record (`EnvironmentRecord`, `OsceEnvironmentRecord`): hashed into the spec."""
    opener: Callable[[Any], ContextManager]
    """`open_environment` of the environment's module: up for the run, down after."""
    notes: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return self.record.source(self.cases)

    def environment(self) -> ContextManager:
        return self.opener(self.record)
