"""Stage 4, reflect: after grading (gold visible), the run's policy learns from the case.

What is learnt, and how, is the policy's (handlers/policies/*): it emits memory events
through the stage's writer. A reflection that fails is recorded as `case.failed` and
writes nothing.
"""

from __future__ import annotations

from grandrounds.handlers.cases import Case
from grandrounds.handlers.context import RunContext
from grandrounds.store.event_types import AnswerGiven, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded
from grandrounds.store.llm_events import CaseFailed


async def reflect(ctx: RunContext, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                  fb: FeedbackRecorded) -> ReflectionRecorded | CaseFailed | None:
    return await ctx.mechanism.reflect(ctx, case, memory, answer, fb)
