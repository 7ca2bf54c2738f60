"""The stage machine of a case: the order of the five stages, what comes next, the terminal state.

Defined once, here, and driven by both transports: the embedded runner runs a case's stages in a
row (handlers/pipeline.py `process_case`), the Kafka worker one stage per message
(streams/kafka_worker/). `CaseProgress` is what the log holds for a case; `next_stage` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grandrounds.store.event_types import AnswerGiven, CaseCompleted, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded
from grandrounds.store.llm_events import CaseFailed

STAGES = ("retrieve", "act", "feedback", "reflect", "govern")
"""The five stages in the order a case goes through them. A case may skip some (below), never reorder."""
Stage = Literal["retrieve", "act", "feedback", "reflect", "govern"]

STAGE_VERSIONS: dict[str, int] = {"retrieve": 2, "act": 2, "feedback": 2, "reflect": 2, "govern": 2}
"""2: exact (int8) vectors and decision arithmetic, `embeddings.recorded` after a stage that used new vectors."""
"""The version of the code that shapes each stage's events, recorded in every run's `run.started`
(handlers/code_versions.py). Bump a stage's number in the commit that changes the bytes of the
events it writes (deliberately: regenerate tests/golden with scripts/golden_logs.py), so `verify`
of a run recorded before says which version recorded it instead of a bare divergence."""


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


