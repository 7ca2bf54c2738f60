"""A stage message on its way through the worker, and where it stands.

A delivery comes from the stage consumer (its offset is known), or from the worker itself: a run
takes up its next stage's command as soon as it hands it to the producer, before the broker says
at which offset it landed. Its state says which, explicitly, because what may be done with it
differs: only a delivery whose offset is known can be committed (its step stored with the
position it frees), and a command the broker refused must never be.

    FETCHED ─────────────────────────────► (done)
    AHEAD ──ack / the consumer's copy──► ACKED ──► (done)
      └────────── produce refused ──────► LOST   (its step is dropped; the run is restored and kicked)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from grandrounds.handlers.stages import STAGES
from grandrounds.store.errors import Bug

STAGE_INDEX = {s: i for i, s in enumerate(STAGES)}
START_KEY = (-1, 0)
"""The step key of a run's RunStart; a case's stages are (index, stage position)."""


class DeliveryState(Enum):
    FETCHED = "fetched"
    """Consumed from Kafka: its offset is known."""
    AHEAD = "ahead"
    """Produced by this worker and taken up before the broker acknowledged it: no offset yet."""
    ACKED = "acked"
    """Was AHEAD; its offset is now known (from the produce ack, or from the consumer's copy)."""
    LOST = "lost"
    """Was AHEAD; the broker refused the command, so it is not in Kafka and its step cannot commit."""


@dataclass
class Delivery:
    stage: str
    body: Any
    topic: str
    partition: int
    offset: int | None
    """None exactly while AHEAD (or LOST)."""
    timestamp_ms: int
    received: float
    key: tuple[int, int]
    own: bool = False
    """Delivered by this worker to itself (AHEAD, then ACKED or LOST)."""
    sent: asyncio.Future | None = None
    """An own delivery: the produce acknowledgement of its command."""
    state: DeliveryState = field(init=False)
    lost: BaseException | None = field(default=None, init=False)
    """LOST: why the broker did not take the command."""

    def __post_init__(self) -> None:
        if self.offset is not None:
            self.state = DeliveryState.ACKED if self.own else DeliveryState.FETCHED
        elif self.own:
            self.state = DeliveryState.AHEAD
        else:
            raise Bug("a delivery from the consumer always has an offset")

    @property
    def offset_known(self) -> bool:
        return self.state in (DeliveryState.FETCHED, DeliveryState.ACKED)

    def acknowledge(self, offset: int) -> None:
        """AHEAD → ACKED: the command is in Kafka at `offset`."""
        if self.state is not DeliveryState.AHEAD:
            raise Bug(f"acknowledge a delivery that is {self.state.value}")
        self.offset, self.state = offset, DeliveryState.ACKED

    def lose(self, exc: BaseException) -> None:
        """AHEAD → LOST: the broker refused the command."""
        if self.state is not DeliveryState.AHEAD:
            raise Bug(f"lose a delivery that is {self.state.value}")
        self.lost, self.state = exc, DeliveryState.LOST


def step_key(stage: str, body: Any) -> tuple[int, int]:
    """Where a message falls in its run's order: the RunStart, a case's arrival, or one of its stages."""
    from grandrounds.streams.messages import CaseMessage, RunStart

    if isinstance(body, RunStart):
        return START_KEY
    if isinstance(body, CaseMessage):
        return (body.index, 0)
    return (body.index, STAGE_INDEX[stage])
