"""The backbone interface the act and reflect stages call."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from grandrounds.handlers.cases import Case, CaseView
# CaseFailure and records_exchanges live in handlers/llm (below handlers/agent and the policies, which raise
# and ask them too); re-exported here, where the stages and other callers have always found them.
from grandrounds.handlers.llm.errors import CaseFailure  # noqa: F401
from grandrounds.handlers.llm.recorder import Recorder, records_exchanges  # noqa: F401  (Recorder: see Backbone)
from grandrounds.handlers.tools import ToolBox
from grandrounds.store.event_types import AnswerGiven, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded


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
