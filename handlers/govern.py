"""Stage 5, govern: the policy's periodic housekeeping, then close the case (memory watermark)."""

from __future__ import annotations

from grandrounds.handlers.cases import Case
from grandrounds.handlers.context import RunContext
from grandrounds.store.event_types import CaseCompleted, FeedbackRecorded


async def govern(ctx: RunContext, case: Case, index: int, fb: FeedbackRecorded) -> CaseCompleted:
    await ctx.mechanism.govern(ctx, case, index, fb)
    done = CaseCompleted(index=index, correct=fb.correct)
    ctx.writer.emit(done, case_id=case.case_id)
    return done
