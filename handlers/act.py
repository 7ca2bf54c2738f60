"""Stage 2, act: the backbone answers the case from its gold-free view and the rendered memory."""

from __future__ import annotations

from handlers.backbones.base import CaseFailure, records_exchanges
from handlers.cases import CaseView
from handlers.context import RunContext
from handlers.llm.recorder import stage_recorder
from handlers.randomness import case_rng
from handlers.tools import ToolBox
from store.event_types import AnswerGiven, MemoryRetrieved
from store.llm_events import CaseFailed


class ActError(RuntimeError):
    pass


async def act(ctx: RunContext, view: CaseView, memory: MemoryRetrieved, toolbox: ToolBox) -> AnswerGiven | CaseFailed:
    # `view` has no answer field: the leakage guard is a type, not a promise.
    rng = case_rng(ctx.seed, view.case_id, "act")
    extra = {"recorder": stage_recorder(ctx.writer, view.case_id, "act")} if records_exchanges(ctx.backbone) else {}
    try:
        answer = await ctx.backbone.act(view, memory, toolbox, rng, **extra)
    except CaseFailure as exc:
        failed = CaseFailed(stage="act", reason=exc.reason, steps=exc.steps)
        ctx.writer.emit(failed, case_id=view.case_id)
        return failed
    if answer.answer not in view.options:
        raise ActError(f"case {view.case_id}: backbone answered {answer.answer!r}, not an option")
    ctx.writer.emit(answer, case_id=view.case_id)
    return answer
