"""The backbone interface the act and reflect stages call."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from handlers.cases import Case, CaseView
from handlers.tools import ToolBox
from store.event_types import AnswerGiven, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded


class Backbone(Protocol):
    name: str
    model: str | None
    note: str
    """One line every report shows about what this backbone's numbers mean."""

    async def act(self, view: CaseView, memory: MemoryRetrieved, toolbox: ToolBox,
                  rng: np.random.Generator) -> AnswerGiven:
        """Answer a case. Gets the case without its gold answer, and the rendered memory."""
        ...

    async def reflect(self, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                      feedback: FeedbackRecorded) -> ReflectionRecorded:
        """After feedback (gold visible): a summary, a guideline and patch-style rule edits."""
        ...
