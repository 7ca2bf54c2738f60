"""The backbone interface the act and reflect stages call."""

from __future__ import annotations

from grandrounds.store.errors import GrandroundsError
from typing import Literal, Protocol

import numpy as np

from grandrounds.handlers.cases import Case, CaseView
from grandrounds.handlers.llm.recorder import Recorder  # noqa: F401  (part of the protocol: see Backbone)
from grandrounds.handlers.tools import ToolBox
from grandrounds.store.event_types import AgentStep, AnswerGiven, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded


class CaseFailure(GrandroundsError):
    """Raised by a backbone when a case cannot be completed (model unreachable after retries,
    output unusable to the last step). The stage records it as `case.failed` with `steps`,
    the trajectory so far, and memory is not written from the case."""

    def __init__(self, reason: str, steps: list[AgentStep] | None = None,
                 termination: Literal["invalid_action", "turn_limit", "error"] = "error"):
        self.reason = reason
        self.steps = list(steps or [])
        self.termination = termination
        """Why the episode ended without an answer: an invalid action (the official MedAgentBench
        protocol ends there), the turn limit, or an error (a model unreachable, a failed summary)."""
        super().__init__(reason)


class Backbone(Protocol):
    """A backbone that calls a model sets `records_exchanges = True`; the stages then pass it
    `recorder=`, which puts every model exchange into the stage's events before its result is
    used (DESIGN §3). Model-free backbones (sim) leave it unset and keep the plain signature."""

    name: str
    model: str | None
    note: str
    """One line every report shows about what this backbone's numbers mean."""

    async def act(self, view: CaseView, memory: MemoryRetrieved, toolbox: ToolBox,
                  rng: np.random.Generator) -> AnswerGiven:
        """Answer a case. Gets the case without its gold answer, and the rendered memory.
        (Recording backbones: also `recorder: Recorder`.)"""
        ...

    async def reflect(self, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                      feedback: FeedbackRecorded) -> ReflectionRecorded:
        """After feedback (gold visible): a summary, a guideline and patch-style rule edits."""
        ...


def records_exchanges(backbone: object) -> bool:
    return bool(getattr(backbone, "records_exchanges", False))
