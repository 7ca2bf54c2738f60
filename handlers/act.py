"""Stage 2, act: the backbone answers the case from its gold-free view and the rendered memory."""

from __future__ import annotations

from handlers.cases import CaseView
from handlers.context import RunContext
from handlers.randomness import case_rng
from handlers.tools import ToolBox
from store.event_types import AnswerGiven, MemoryRetrieved


class ActError(RuntimeError):
    pass


async def act(ctx: RunContext, view: CaseView, memory: MemoryRetrieved, toolbox: ToolBox) -> AnswerGiven:
    # `view` has no answer field: the leakage guard is a type, not a promise.
    rng = case_rng(ctx.seed, view.case_id, "act")
    answer = await ctx.backbone.act(view, memory, toolbox, rng)
    if answer.answer not in view.options:
        raise ActError(f"case {view.case_id}: backbone answered {answer.answer!r}, not an option")
    ctx.writer.emit(answer, case_id=view.case_id)
    return answer
