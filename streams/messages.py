"""Message models of the Kafka transport: what travels on each topic, validated by pydantic.

Every message is keyed by its `run_id`. The retrieve topic is the intake: a run's
`RunStart` followed by its cases, in order. The other stage topics carry a `StageCommand`:
"run stage S of case i", produced by the worker after stage S−1's events are committed.
A command carries no stage inputs: those are read from the run's log, so a redelivered or
replayed command can only ever repeat what the log says.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model

from grandrounds.handlers.cases import Case
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.events import stored_columns


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunStart(_Message):
    """Opens a run: the worker appends `run.started` (seq 0) from `spec`."""

    kind: Literal["run.start"] = "run.start"
    run_id: str = Field(min_length=1)
    spec: RunSpec
    cases: int = Field(ge=0)
    """How many case messages follow (the submitter's count): declared in the run's `run.started`, so the
    worker appends `run.completed` after the last of them and `verify` can tell a whole log from a cut one."""


class CaseMessage(_Message):
    """Case `index` of the run (0-based): the retrieve stage's input."""

    kind: Literal["case"] = "case"
    run_id: str = Field(min_length=1)
    index: int = Field(ge=0)
    case: Case


RetrieveCommand = Annotated[Union[RunStart, CaseMessage], Field(discriminator="kind")]


class StageCommand(_Message):
    """Run one stage (the topic says which) of case `index`; its inputs come from the log."""

    run_id: str = Field(min_length=1)
    index: int = Field(ge=0)
    case_id: str = Field(min_length=1)


ChangelogEvent = create_model(
    "ChangelogEvent", __base__=_Message, __module__=__name__,
    __doc__="One stored event, exactly as the writer's DuckDB holds it (chain hash included).",
    # The stored event's own columns (the run id is the batch's): the message follows the store's row.
    **{name: (type_, ...) for name, type_ in stored_columns().items() if name != "run_id"},
)


class ChangelogBatch(_Message):
    """One appended batch (a stage's events) of one run: wholly in the changelog or absent."""

    run_id: str
    events: list[ChangelogEvent]


class DeadLetter(_Message):
    """A message the worker could not accept (invalid) or could not process (failed), with why."""

    reason: Literal["invalid", "rejected", "failed"]
    error: str
    source_topic: str
    partition: int
    offset: int
    key: str | None
    value: str
    """The original value as text (undecodable bytes replaced); `value_base64` has it exactly."""
    value_base64: str

    @classmethod
    def of(cls, reason: str, error: str, topic: str, partition: int, offset: int,
           key: bytes | None, value: bytes | None) -> "DeadLetter":
        raw = value or b""
        return cls(reason=reason, error=error[:4000], source_topic=topic, partition=partition, offset=offset,
                   key=None if key is None else key.decode("utf-8", "replace"),
                   value=raw.decode("utf-8", "replace")[:100_000], value_base64=base64.b64encode(raw).decode())
