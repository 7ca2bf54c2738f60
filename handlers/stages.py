"""The stage machine of a case: the five stages, in order, with what each runs, what comes next, the terminal state.

Defined once, here, and driven by both transports: the embedded runner runs a case's stages in a
row (handlers/pipeline.py `process_case`), the Kafka worker one stage per message
(streams/kafka_worker/). `STAGE_TABLE` is the one place a stage is declared: its handler, the
output it leaves in `CaseProgress`, and the facts the transports need (which stages read the pinned
memory under `--lag`, which the ahead pass runs, which topic a stage consumes and whether that is the
run's intake). The pipeline, the lag pipeline (streams/lag.py), the Kafka worker and its topics
(streams/topics.py, streams/kafka_app.py) all read it instead of spelling stages out
(tests/test_stage_table.py checks that each of them sees exactly this table).
`CaseProgress` is what the log holds for a case; `next_stage` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable, Literal

from grandrounds.handlers.act import act
from grandrounds.handlers.environments.base import require_environment
from grandrounds.handlers.feedback import feedback
from grandrounds.handlers.govern import govern
from grandrounds.handlers.reflect import reflect
from grandrounds.handlers.retrieve import retrieve
from grandrounds.handlers.tools import ToolBox
from grandrounds.store.event_types import AnswerGiven, CaseCompleted, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded
from grandrounds.store.llm_events import CaseFailed

if TYPE_CHECKING:
    from grandrounds.handlers.cases import Case, FhirCase
    from grandrounds.handlers.context import RunContext

Stage = Literal["retrieve", "act", "feedback", "reflect", "govern"]
"""The stage names, for type checkers (a Literal cannot be built from the table; the table test checks
that the two agree)."""


@dataclass
class CaseProgress:
    memory: MemoryRetrieved | None = None
    answer: AnswerGiven | None = None
    feedback: FeedbackRecorded | None = None
    reflection: ReflectionRecorded | None = None
    completed: CaseCompleted | None = None
    failed: CaseFailed | None = None
    """Set when act or reflect could not complete (the stage is in `failed.stage`)."""
    reflected: bool = False
    """reflect ran in this process and wrote no reflection (a policy that keeps no memory). In memory
    only: a case read back from the log reflects again, which writes nothing again."""

    @property
    def started(self) -> bool:
        return self.memory is not None

    @property
    def done(self) -> bool:
        """The terminal state: case.completed is recorded (correct, incorrect, or failed)."""
        return self.completed is not None


StageHandler = Callable[["RunContext", "Case | FhirCase", int, CaseProgress], Awaitable[None]]
"""Runs one stage of case `index` and records its output in the progress (its events go to ctx.writer)."""


async def _retrieve(ctx: RunContext, case: Case | FhirCase, index: int, p: CaseProgress) -> None:
    p.memory = await retrieve(ctx, case, index)


async def _act(ctx: RunContext, case: Case | FhirCase, index: int, p: CaseProgress) -> None:
    if case.kind in ("fhir", "osce"):  # the run's environment: FHIR functions / OSCE patient, fresh per case
        toolbox = require_environment(ctx, case).tools_for(case)
    else:
        toolbox = ToolBox(case, ctx.tools, ctx.seed)  # built from the full case: the environment's side
    result = await act(ctx, case.view(), p.memory, toolbox)
    if isinstance(result, CaseFailed):
        p.failed = result
    else:
        p.answer = result


async def _feedback(ctx: RunContext, case: Case | FhirCase, index: int, p: CaseProgress) -> None:
    p.feedback = await feedback(ctx, case, p.memory, p.answer)


async def _reflect(ctx: RunContext, case: Case | FhirCase, index: int, p: CaseProgress) -> None:
    result = await reflect(ctx, case, p.memory, p.answer, p.feedback)
    if isinstance(result, CaseFailed):
        p.failed = result
    else:
        p.reflection = result
        p.reflected = True


async def _govern(ctx: RunContext, case: Case | FhirCase, index: int, p: CaseProgress) -> None:
    if p.answer is None:
        # No answer: the case counts as incorrect, and no feedback, reflection or governance
        # runs from it, so a failed case never changes memory.
        p.completed = CaseCompleted(index=index, correct=False)
        ctx.writer.emit(p.completed, case_id=case.case_id)
    else:
        p.completed = await govern(ctx, case, index, p.feedback)


@dataclass(frozen=True)
class StageDef:
    """One stage: what it runs and what the transports need to know about it."""

    name: str
    run: StageHandler
    output: type
    """The event type of the stage's output (`case_progress` reads a case's progress back by it)."""
    field: str
    """The `CaseProgress` field that output goes to."""
    version: int
    """The version of the code that shapes the stage's events (STAGE_VERSIONS below)."""
    pinned: bool = False
    """Under `--lag k` it reads the memory pinned at the end of case i-1-k (streams/lag.py); else the live one."""
    ahead: bool = False
    """The ahead pass runs it over the pinned memory, writing nothing (streams/lag.py `AheadPass`)."""
    intake: bool = False
    """Its topic is the run's intake: the submitter's RunStart, then the cases; the other stages' topics
    carry the worker's own commands (streams/kafka_app.py)."""
    closes_case: bool = False
    """It records `case.completed`: the case is done, and after the last one the run (`run.completed`)."""
    doc: str = ""
    """What the stage does, as the AsyncAPI document (docs/asyncapi.json) describes its topic."""

    @property
    def topic(self) -> str:
        """The name of the topic it consumes, under a deployment's prefix (streams/topics.py)."""
        return self.name


STAGE_TABLE: tuple[StageDef, ...] = (
    StageDef("retrieve", _retrieve, MemoryRetrieved, "memory", 2, pinned=True, ahead=True, intake=True,
             doc="Intake of a run: its `RunStart`, then its cases in order. Takes a case in and reads memory for it."),
    StageDef("act", _act, AnswerGiven, "answer", 2, pinned=True, ahead=True,
             doc="The backbone answers the case from its gold-free view and the retrieved memory (the LLM call)."),
    StageDef("feedback", _feedback, FeedbackRecorded, "feedback", 2, ahead=True,
             doc="Grades the recorded answer; attributes the outcome to rules and tools."),
    StageDef("reflect", _reflect, ReflectionRecorded, "reflection", 2, ahead=True,
             doc="After feedback: reflection, episode and rule edits (memory writes)."),
    StageDef("govern", _govern, CaseCompleted, "completed", 2, closes_case=True,
             doc="Relabels tools and closes the case (the memory watermark advances)."),
)
"""The stages in the order a case goes through them. A case may skip some (`next_stage`), never reorder."""

STAGE_BY_NAME: dict[str, StageDef] = {s.name: s for s in STAGE_TABLE}

STAGES: tuple[str, ...] = tuple(s.name for s in STAGE_TABLE)
"""The five stages in the order a case goes through them. A case may skip some (below), never reorder."""

INTAKE_STAGE: str = next(s.name for s in STAGE_TABLE if s.intake)
"""The stage a case enters by (its topic carries the run's RunStart and cases)."""

STAGE_VERSIONS: dict[str, int] = {s.name: s.version for s in STAGE_TABLE}
"""2: exact (int8) vectors and decision arithmetic, `embeddings.recorded` after a stage that used new vectors.

The version of the code that shapes each stage's events, recorded in every run's `run.started`
(handlers/code_versions.py). Bump a stage's number in the commit that changes the bytes of the
events it writes (deliberately: regenerate tests/golden with scripts/golden_logs.py), so `verify`
of a run recorded before says which version recorded it instead of a bare divergence."""


def stage_def(stage: str) -> StageDef:
    """The table's row for `stage`; ValueError for a name that is not a stage."""
    try:
        return STAGE_BY_NAME[stage]
    except KeyError:
        raise ValueError(f"unknown stage {stage!r}") from None


def closes_case(stage: str) -> bool:
    return STAGE_BY_NAME[stage].closes_case


def next_stage(progress: CaseProgress) -> Stage | None:
    """The stage a case with this progress runs next; None once it is done.

    The one definition of the stage order and its skips, driven by the embedded runner (process_case,
    all stages in a row) and by the Kafka worker (one stage per message):
    - no answer (act failed): straight to govern, which records the case as incorrect; a failed case
      gets no feedback, reflection or governance, so it never changes memory;
    - reflect failed or wrote nothing: on to govern.
    """
    if progress.completed is not None:
        return None
    if progress.memory is None:
        return "retrieve"
    if progress.answer is None:
        return "act" if progress.failed is None else "govern"
    if progress.feedback is None:
        return "feedback"
    if progress.reflection is None and progress.failed is None and not progress.reflected:
        return "reflect"
    return "govern"
