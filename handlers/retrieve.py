"""Stage 1, retrieve: take the case in and read memory for it, as the run's policy selects."""

from __future__ import annotations

from grandrounds.handlers.cases import Case
from grandrounds.handlers.context import RunContext
from grandrounds.store.event_types import CaseReceived, MemoryRetrieved


async def retrieve(ctx: RunContext, case: Case, index: int) -> MemoryRetrieved:
    ctx.projection.state.check_open(ctx.run_id, case.case_id)  # a complete run takes no more cases
    memory_seq = ctx.projection.seq  # the memory version this case reads
    ctx.writer.emit(CaseReceived(index=index, case=case.model_dump(mode="json")), case_id=case.case_id)
    result = ctx.mechanism.retrieve(ctx, case, memory_seq)
    ctx.writer.emit(result, case_id=case.case_id)
    return result
