"""Where a backbone's model exchanges go: the calling stage's event batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from grandrounds.store.events import EventPayload

Emit = Callable[[EventPayload, dict[str, Any]], int]
NoteAttempt = Callable[[dict[str, Any]], None]


def _drop(_row: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class Recorder:
    """Handed by a stage to the backbone, so exchanges land in that stage's transaction."""

    case_id: str
    """The case the calls are made for (names it in a divergence error)."""
    stage: str
    """The pipeline stage making the calls: act, reflect, ..."""
    emit: Emit
    """Appends (payload, meta) to the stage's events, returning the seq it got."""
    note_attempt: NoteAttempt = _drop
    """Keeps one failed transport attempt outside the event log (the `llm_attempts` side table):
    written at once, so it survives even when the case's events are never written (an outage)."""


def stage_recorder(writer, case_id: str, stage: str) -> Recorder:
    from grandrounds.store.attempts import note_attempt

    def emit(payload: EventPayload, meta: dict[str, Any]) -> int:
        return writer.emit(payload, case_id=case_id, meta=meta)

    def note(row: dict[str, Any]) -> None:
        note_attempt(writer.store, writer.run_id, case_id, stage, row)

    return Recorder(case_id, stage, emit, note)


def records_exchanges(backbone: object) -> bool:
    """Whether a backbone calls a model: the stages then pass it `recorder=` (handlers/backbones/base.py)."""
    return bool(getattr(backbone, "records_exchanges", False))
