"""Stage 4, reflect: after grading (gold visible), the run's policy learns from the case.

What is learnt, and how, is the policy's (handlers/policies/*): it emits memory events
through the stage's writer. A reflection that fails is recorded as `case.failed` and
writes nothing.
"""

from __future__ import annotations

from handlers.cases import Case
from handlers.context import RunContext
from store.event_types import AnswerGiven, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded
from store.llm_events import CaseFailed


async def reflect(ctx: RunContext, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                  fb: FeedbackRecorded) -> ReflectionRecorded | CaseFailed | None:
    return await ctx.mechanism.reflect(ctx, case, memory, answer, fb)
