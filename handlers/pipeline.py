"""The five stages chained for one case, resumable at stage granularity.

Each stage's result is also the payload of its event, so a case interrupted after some
stages resumes from the log: the outputs already recorded are read back, and only the
missing stages run. Transports (embedded, Kafka) decide when to flush a stage's events.

A FHIR task (`FhirCase`) runs the same five stages; its tools and grading come from the
run's environment (`ctx.environment`), which the composition root builds.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from grandrounds.handlers.cases import Case, FhirCase
from grandrounds.handlers.context import RunContext
from grandrounds.handlers.stages import (STAGE_TABLE, STAGES, CaseProgress, Stage, closes_case,  # noqa: F401
                                         next_stage, stage_def)  # STAGES, next_stage: re-exported
from grandrounds.store.event_types import CaseCompleted, RunCompleted
from grandrounds.store.eventstore import EventStore
from grandrounds.store.llm_events import CaseFailed
from grandrounds.store.recorded_vectors import noting_vectors, recorded_event


def case_progress(store: EventStore, run_id: str, case_id: str, after_seq: int = -1) -> CaseProgress:
    """What the log already holds for a case (stage outputs), from its events."""
    p = CaseProgress()
    for e in store.iter(run_id, after_seq=after_seq, case_id=case_id):
        field = PROGRESS_FIELDS.get(e.type)
        if field is not None:
            setattr(p, field, e.decode())
    return p


PROGRESS_FIELDS: dict[str, str] = {**{s.output.event_type: s.field for s in STAGE_TABLE}, CaseFailed.event_type: "failed"}
"""Event type → the `CaseProgress` field it fills: each stage's output (the stage table), and a failure."""


StageDone = Callable[[str], Awaitable[None]]


async def _noop(stage: str) -> None:
    return None


async def run_stage(ctx: RunContext, case: Case | FhirCase, index: int, progress: CaseProgress, stage: Stage) -> None:
    """Run one stage of a case and record its output in `progress` (its events go to ctx.writer).

    The vectors the stage used that the run has not recorded yet follow its events as one
    `embeddings.recorded` (recorded inputs, DESIGN §3); after the last case's govern, `run.completed`
    comes last."""
    run = stage_def(stage).run
    try:
        with noting_vectors() as used:
            await run(ctx, case, index, progress)
    except Exception as exc:
        mark_where(exc, ctx, case.case_id, stage)
        raise
    record_vectors(ctx, used, case.case_id)
    if closes_case(stage):
        close_run_if_done(ctx)


def mark_where(exc: BaseException, ctx: RunContext, case_id: str, stage: Stage) -> None:
    """Say on `exc` where it escaped — the case, the stage and the component that runs it — for the one
    error boundary (grandrounds/errors.py `message_of`): 'at case ex-004 (act stage, backbone agent
    my_agent:answer)'. The exception itself is not replaced: callers still catch it by its class. The
    innermost mark wins (a stage that calls another keeps the first)."""
    if getattr(exc, "grandrounds_where", None) is None:
        name = getattr(stage, "value", stage)
        backbone = type(ctx.backbone).__name__.removesuffix("Backbone").lower() or "backbone"
        model = getattr(ctx.backbone, "model", None)
        component = f"backbone {backbone}" + (f" {model}" if model else "")
        where = f"at case {case_id} ({name} stage, {component})"
        try:
            exc.grandrounds_where = where
        except AttributeError:  # an exception type without a __dict__: its message stands alone
            return
        exc.add_note(f"grandrounds: raised {where}")  # a Python API caller's traceback says where too


def record_vectors(ctx: RunContext, used: dict, case_id: str | None = None) -> None:
    """Emit the vectors in `used` that the run's log does not hold yet (in first-use order). Checked
    against the live projection (the writer's): a pinned stage reads an older copy of memory."""
    known = ctx.writer.projection.vector_keys
    new = [(k, q) for k, q in used.items() if k not in known]
    if new:
        ctx.writer.emit(recorded_event(ctx.projection.cache.model, new), case_id=case_id)


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
