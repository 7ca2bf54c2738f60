"""Stage 3, feedback: grade the recorded answer; the policy attributes the outcome.

Runs only after the answer event exists, so the gold answer becomes visible strictly after
the agent committed to its answer. FHIR tasks are graded by the environment's official
refsol rules from the recorded answer (its FINISH payload and the calls in its steps); `gold`
then names the reference and the grader's reason (`refsol:task3: payload matches`).
"""

from __future__ import annotations

from grandrounds.handlers.cases import Case, FhirCase
from grandrounds.handlers.context import RunContext
from grandrounds.store.event_types import AnswerGiven, FeedbackRecorded, MemoryRetrieved


async def feedback(ctx: RunContext, case: Case | FhirCase, memory: MemoryRetrieved,
                   answer: AnswerGiven) -> FeedbackRecorded:
    if case.kind == "fhir":
        return await feedback_fhir(ctx, case, memory, answer)
    if case.kind == "osce":
        return await feedback_osce(ctx, case, memory, answer)
    correct = answer.answer == case.answer
    rule_outcomes, tool_outcomes = ctx.mechanism.outcomes(ctx, case, memory, answer, correct)
    result = FeedbackRecorded(answer=answer.answer, gold=case.answer, correct=correct,
                              rule_outcomes=rule_outcomes, tool_outcomes=tool_outcomes)
    ctx.writer.emit(result, case_id=case.case_id)
    return result


async def feedback_fhir(ctx: RunContext, case: FhirCase, memory: MemoryRetrieved,
                        answer: AnswerGiven) -> FeedbackRecorded:
    from grandrounds.handlers.environments.base import require_environment

    env = require_environment(ctx, case)
    verdict = getattr(env, "verdict", None)
    if verdict is not None:  # MedAgentBench: the grade with the reference solution's rounds
        correct, gold, min_rounds = await verdict(case, answer)
    else:
        (correct, gold), min_rounds = await env.grade(case, answer), None
    rule_outcomes, tool_outcomes = ctx.mechanism.outcomes(ctx, case, memory, answer, correct)
    result = FeedbackRecorded(answer=answer.answer, gold=gold, correct=correct,
                              rule_outcomes=rule_outcomes, tool_outcomes=tool_outcomes, min_rounds=min_rounds)
    ctx.writer.emit(result, case_id=case.case_id)
    return result


async def feedback_osce(ctx: RunContext, case, memory: MemoryRetrieved, answer: AnswerGiven) -> FeedbackRecorded:
    """An AgentClinic OSCE case: the LLM judge (recorded, stage `judge`) with a model backbone, the
    normalised string match with sim; `gold` is the correct diagnosis."""
    from grandrounds.handlers.environments.osce_env import judge_answer

    verdict = await judge_answer(ctx, case, answer)
    rule_outcomes, tool_outcomes = ctx.mechanism.outcomes(ctx, case, memory, answer, verdict.correct)
    result = FeedbackRecorded(answer=answer.answer, gold=case.correct_diagnosis, correct=verdict.correct,
                              rule_outcomes=rule_outcomes, tool_outcomes=tool_outcomes)
    ctx.writer.emit(result, case_id=case.case_id)
    return result
