"""Stage 3, feedback: grade the recorded answer; attribute the outcome to rules and tools.

Runs only after the answer event exists, so the gold answer becomes visible strictly after
the agent committed to its answer.
"""

from __future__ import annotations

from handlers.cases import Case
from handlers.context import RunContext
from handlers.policies.config import EvoMedAgentPolicy
from store.event_types import AnswerGiven, FeedbackRecorded, MemoryRetrieved, RuleOutcome, ToolCall, ToolOutcome


def tool_outcome(call: ToolCall, gold: str) -> str:
    """helpful: pointed at the gold option; harmful: asserted a wrong option;
    misuse: called although governance said Avoid; neutral: returned nothing usable."""
    if call.label == "Avoid":
        return "misuse"
    if call.output is None:
        return "neutral"
    return "helpful" if call.output == gold else "harmful"


async def feedback(ctx: RunContext, case: Case, memory: MemoryRetrieved, answer: AnswerGiven) -> FeedbackRecorded:
    correct = answer.answer == case.answer
    policy = ctx.policy
    learns = isinstance(policy, EvoMedAgentPolicy) and policy.writing
    rule_outcomes = [RuleOutcome(rule_id=r.rule_id, helpful=correct) for r in memory.rules] if learns else []
    tool_outcomes = ([ToolOutcome(tool=c.tool, outcome=tool_outcome(c, case.answer)) for c in answer.tool_calls]
                     if learns and policy.governance else [])
    result = FeedbackRecorded(answer=answer.answer, gold=case.answer, correct=correct,
                              rule_outcomes=rule_outcomes, tool_outcomes=tool_outcomes)
    ctx.writer.emit(result, case_id=case.case_id)
    return result
