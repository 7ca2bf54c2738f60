"""Stage 2, act: the backbone answers the case from its gold-free view and the rendered memory.

MCQ cases answer with an option letter, or `NO_ANSWER` (source `none`) when the agent gave no
valid answer: that case is still graded (wrong) and reflected on. FHIR tasks (kind `fhir`) are acted on through the
environment's FHIR tools; their answer is the FINISH payload, and the trajectory the environment
executed is recorded as the answer's steps (what feedback grades).
"""

from __future__ import annotations

from grandrounds.store.errors import Bug
from grandrounds.handlers.agent.react import NO_ANSWER
from grandrounds.handlers.backbones.base import CaseFailure, records_exchanges
from grandrounds.handlers.cases import CaseView, FhirCaseView
from grandrounds.handlers.context import RunContext
from grandrounds.handlers.llm.recorder import stage_recorder
from grandrounds.handlers.randomness import case_rng
from grandrounds.handlers.tools import ToolBox
from grandrounds.store.event_types import AnswerGiven, MemoryRetrieved
from grandrounds.store.llm_events import CaseFailed


class ActError(Bug, RuntimeError):
    """A backbone broke the act contract (an answer outside the options, a backbone asked to act on a
    task kind it cannot): a bug of that backbone, not of the case."""


def _agent_extras(ctx: RunContext, view: CaseView | FhirCaseView, memory: MemoryRetrieved) -> dict:
    """What the MCQ and FHIR agent loops are handed besides the case: the stage's recorder (model
    backbones), the policy's per-step retrieval (SELSM) and its retrospective summaries (RetroSum,
    for backbones whose loops write them), each only when there is one."""
    extra = {"recorder": stage_recorder(ctx.writer, view.case_id, "act")} if records_exchanges(ctx.backbone) else {}
    step_memory = ctx.mechanism.step_memory(ctx, view, memory)
    if step_memory is not None:
        extra["step_memory"] = step_memory
    retrospection = ctx.mechanism.retrospection(ctx, view, memory)
    if retrospection is not None and getattr(ctx.backbone, "summarises", False):
        extra["retrospection"] = retrospection
    return extra


async def act(ctx: RunContext, view: CaseView | FhirCaseView, memory: MemoryRetrieved,
              toolbox: ToolBox) -> AnswerGiven | CaseFailed:
    # `view` has no answer field: the leakage guard is a type, not a promise.
    if view.kind == "fhir":
        return await act_fhir(ctx, view, memory, toolbox)
    if view.kind == "osce":
        return await act_osce(ctx, view, memory, toolbox)
    rng = case_rng(ctx.seed, view.case_id, "act")
    extra = _agent_extras(ctx, view, memory)
    try:
        answer = await ctx.backbone.act(view, memory, toolbox, rng, **extra)
    except CaseFailure as exc:
        failed = CaseFailed(stage="act", reason=exc.reason, steps=exc.steps, termination=exc.termination)
        ctx.writer.emit(failed, case_id=view.case_id)
        return failed
    if answer.answer not in view.options and not (answer.answer == NO_ANSWER and answer.source == "none"):
        raise ActError(f"case {view.case_id}: backbone answered {answer.answer!r}, not an option")
    ctx.writer.emit(answer, case_id=view.case_id)
    return answer


async def act_fhir(ctx: RunContext, view: FhirCaseView, memory: MemoryRetrieved, tools) -> AnswerGiven | CaseFailed:
    """`tools`: the case's `FhirTools` from the run's environment. The backbone runs its FHIR agent;
    the steps recorded are the environment's (each tool step is the call it executed, at the public base)."""
    act_on = getattr(ctx.backbone, "act_fhir", None)
    if act_on is None:
        raise ActError(f"case {view.case_id}: the {ctx.backbone.name} backbone cannot act on FHIR tasks")
    extra = _agent_extras(ctx, view, memory)
    env = ctx.environment
    try:
        answer = await act_on(view, memory, tools, **extra)
    except CaseFailure as exc:
        failed = CaseFailed(stage="act", reason=env.public(exc.reason),
                            steps=env.recorded_steps(exc.steps, tools), termination=exc.termination)
        ctx.writer.emit(failed, case_id=view.case_id)
        return failed
    answer = answer.model_copy(update={"steps": env.recorded_steps(answer.steps, tools)})
    ctx.writer.emit(answer, case_id=view.case_id)
    return answer


async def act_osce(ctx: RunContext, view, memory: MemoryRetrieved, tools) -> AnswerGiven | CaseFailed:
    """`view`: the case's `OsceView` (the objective only); `tools`: its `OsceTools` from the run's
    environment (patient and measurement tool). The backbone's doctor runs the dialogue; the answer is
    the diagnosis and its steps are the turns (questions, test requests, what came back). Doctor turns
    are recorded at stage `act`, the model-played patient's at stage `patient`."""
    act_on = getattr(ctx.backbone, "act_osce", None)
    if act_on is None:
        raise ActError(f"case {view.case_id}: the {ctx.backbone.name} backbone cannot act on OSCE cases")
    extra = {"recorder": stage_recorder(ctx.writer, view.case_id, "act"),
             "patient_recorder": stage_recorder(ctx.writer, view.case_id, "patient")} \
        if records_exchanges(ctx.backbone) else {}
    try:
        answer = await act_on(view, memory, tools, **extra)
    except CaseFailure as exc:
        failed = CaseFailed(stage="act", reason=exc.reason, steps=exc.steps, termination=exc.termination)
        ctx.writer.emit(failed, case_id=view.case_id)
        return failed
    ctx.writer.emit(answer, case_id=view.case_id)
    return answer
