"""Stage 5, govern: relabel tools from their records, then close the case (memory watermark)."""

from __future__ import annotations

from handlers.cases import Case
from handlers.context import RunContext
from handlers.policies.config import EvoMedAgentPolicy
from handlers.policies.evo_medagent import tool_label
from store.event_types import CaseCompleted, FeedbackRecorded, ToolLabelChanged


async def govern(ctx: RunContext, case: Case, index: int, fb: FeedbackRecorded) -> CaseCompleted:
    policy = ctx.policy
    state = ctx.projection.state
    if isinstance(policy, EvoMedAgentPolicy) and policy.writing and policy.governance:
        for name in sorted(state.tools):
            rec = state.tools[name]
            new = tool_label(rec, policy)
            if new != rec.label:
                ctx.writer.emit(ToolLabelChanged(tool=name, old=rec.label, new=new, n=rec.total,
                                                 helpful=rec.helpful, harmful=rec.harmful, misuse=rec.misuse),
                                case_id=case.case_id)
    done = CaseCompleted(index=index, correct=fb.correct)
    ctx.writer.emit(done, case_id=case.case_id)
    return done
