"""The five stages chained for one case, resumable at stage granularity.

Each stage's result is also the payload of its event, so a case interrupted after some
stages resumes from the log: the outputs already recorded are read back, and only the
missing stages run. Transports (embedded, Kafka) decide when to flush a stage's events.

A FHIR task (`FhirCase`) runs the same five stages; its tools and grading come from the
run's environment (`ctx.environment`), which the composition root builds.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from grandrounds.handlers.act import act
from grandrounds.handlers.cases import Case, FhirCase
from grandrounds.handlers.context import RunContext
from grandrounds.handlers.environments.base import require_environment
from grandrounds.handlers.feedback import feedback
from grandrounds.handlers.govern import govern
from grandrounds.handlers.reflect import reflect
from grandrounds.handlers.retrieve import retrieve
from grandrounds.handlers.stages import STAGES, CaseProgress, Stage, next_stage  # noqa: F401  (re-exported)
from grandrounds.handlers.tools import ToolBox
from grandrounds.store.event_types import (AnswerGiven, CaseCompleted, FeedbackRecorded, MemoryRetrieved,
                                           ReflectionRecorded, RunCompleted)
from grandrounds.store.eventstore import EventStore
from grandrounds.store.llm_events import CaseFailed
from grandrounds.store.recorded_vectors import noting_vectors, recorded_event


def case_progress(store: EventStore, run_id: str, case_id: str, after_seq: int = -1) -> CaseProgress:
    """What the log already holds for a case (stage outputs), from its events."""
    p = CaseProgress()
    for e in store.iter(run_id, after_seq=after_seq, case_id=case_id):
        payload = e.decode()
        if isinstance(payload, MemoryRetrieved):
            p.memory = payload
        elif isinstance(payload, AnswerGiven):
            p.answer = payload
        elif isinstance(payload, FeedbackRecorded):
            p.feedback = payload
        elif isinstance(payload, ReflectionRecorded):
            p.reflection = payload
        elif isinstance(payload, CaseCompleted):
            p.completed = payload
        elif isinstance(payload, CaseFailed):
            p.failed = payload
    return p


StageDone = Callable[[str], Awaitable[None]]


async def _noop(stage: str) -> None:
    return None


async def run_stage(ctx: RunContext, case: Case | FhirCase, index: int, progress: CaseProgress, stage: Stage) -> None:
    """Run one stage of a case and record its output in `progress` (its events go to ctx.writer).

    The vectors the stage used that the run has not recorded yet follow its events as one
    `embeddings.recorded` (recorded inputs, DESIGN §3); after the last case's govern, `run.completed`
    comes last."""
    with noting_vectors() as used:
        await _stage(ctx, case, index, progress, stage)
    record_vectors(ctx, used, case.case_id)
    if stage == "govern":
        close_run_if_done(ctx)


def record_vectors(ctx: RunContext, used: dict, case_id: str | None = None) -> None:
    """Emit the vectors in `used` that the run's log does not hold yet (in first-use order). Checked
    against the live projection (the writer's): a pinned stage reads an older copy of memory."""
    known = ctx.writer.projection.vector_keys
    new = [(k, q) for k, q in used.items() if k not in known]
    if new:
        ctx.writer.emit(recorded_event(ctx.projection.cache.model, new), case_id=case_id)


async def _stage(ctx: RunContext, case: Case | FhirCase, index: int, progress: CaseProgress, stage: Stage) -> None:
    p = progress
    if stage == "retrieve":
        p.memory = await retrieve(ctx, case, index)
    elif stage == "act":
        if case.kind in ("fhir", "osce"):  # the run's environment: FHIR functions / OSCE patient, fresh per case
            toolbox = require_environment(ctx, case).tools_for(case)
        else:
            toolbox = ToolBox(case, ctx.tools, ctx.seed)  # built from the full case: the environment's side
        result = await act(ctx, case.view(), p.memory, toolbox)
        if isinstance(result, CaseFailed):
            p.failed = result
        else:
            p.answer = result
    elif stage == "feedback":
        p.feedback = await feedback(ctx, case, p.memory, p.answer)
    elif stage == "reflect":
        result = await reflect(ctx, case, p.memory, p.answer, p.feedback)
        if isinstance(result, CaseFailed):
            p.failed = result
        else:
            p.reflection = result
            p.reflected = True
    elif stage == "govern":
        if p.answer is None:
            # No answer: the case counts as incorrect, and no feedback, reflection or governance
            # runs from it, so a failed case never changes memory.
            p.completed = CaseCompleted(index=index, correct=False)
            ctx.writer.emit(p.completed, case_id=case.case_id)
        else:
            p.completed = await govern(ctx, case, index, p.feedback)
    else:
        raise ValueError(f"unknown stage {stage!r}")


async def process_case(ctx: RunContext, case: Case | FhirCase, index: int,
                       progress: CaseProgress | None = None, on_stage: StageDone = _noop) -> CaseCompleted:
    """Every stage the case still lacks, in order; `on_stage` after each (the transport flushes there)."""
    p = progress or CaseProgress()
    while (stage := next_stage(p)) is not None:
        await run_stage(ctx, case, index, p, stage)
        await on_stage(stage)
    return p.completed


def close_run_if_done(ctx: RunContext) -> None:
    """After the last declared case's `case.completed`, in the same batch: `run.completed`."""
    state = ctx.projection.state
    if state.completes_run:
        ctx.writer.emit(RunCompleted(cases=state.cases_completed, correct=state.correct))
