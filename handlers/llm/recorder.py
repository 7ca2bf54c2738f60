"""Where a backbone's model exchanges go: the calling stage's event batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from grandrounds.store.events import EventPayload

Emit = Callable[[EventPayload, dict[str, Any]], int]


@dataclass(frozen=True)
class Recorder:
    """Handed by a stage to the backbone, so exchanges land in that stage's transaction."""

    case_id: str
    """The case the calls are made for (names it in a divergence error)."""
    stage: str
    """The pipeline stage making the calls: act, reflect, ..."""
    emit: Emit
    """Appends (payload, meta) to the stage's events, returning the seq it got."""


def stage_recorder(writer, case_id: str, stage: str) -> Recorder:
    def emit(payload: EventPayload, meta: dict[str, Any]) -> int:
        return writer.emit(payload, case_id=case_id, meta=meta)

    return Recorder(case_id, stage, emit)
