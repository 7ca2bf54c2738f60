"""A `grandrounds run` over an environment's tasks (MedAgentBench, AgentClinic OSCE): the checked cases,
the record naming the environment in the run's spec, and how to open the environment for the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager


def refuse_unsupported(env: str, what: str, policy_name: str, supported: tuple[str, ...],
                       sim_tools: tuple[str, ...], tools_are: str, broker: str) -> None:
    """The checks every `--env` makes of the run's other options (ValueError, exit 2): a policy whose
    stages handle `what`, no simulated MCQ tools (the environment's `tools_are` instead), the embedded runner."""
    if policy_name not in supported:
        raise ValueError(f"policy {policy_name!r} does not handle {what} yet: use --policy "
                         f"{' or '.join(supported)} with --env {env}")
    if sim_tools:
        raise ValueError(f"--sim-tool offers simulated MCQ tools: {tools_are}")
    if broker != "memory":
        raise ValueError(f"--env {env} runs on the embedded runner only (omit --broker): the Kafka "
                         "message contract carries MCQ cases")


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
