"""Offline mode: a finished run's memory as one `memory.seeded` event for another run.

SkeMex and RetroSum evaluate by building memory on a train split and then answering a
test split from a frozen copy of it. The copy is the source run's memory-bearing events
(`carries_memory`), verbatim, with the seq and chain hash they were read at: the test run
holds its starting memory in its own log, and nothing in it depends on the source file
still existing. The events carry no backbone, so memory built with one backbone serves
runs with another.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
from typing import Any

from grandrounds.store.case_content import content_key
from grandrounds.store.event_types import CaseReceived, EmbeddingsRecorded, MemorySeeded, RunStarted
from grandrounds.store.events import payload_class
from grandrounds.store.eventstore import EventStore


class SnapshotError(InvalidInput, ValueError):
    pass


def memory_snapshot(store: EventStore, run_id: str) -> MemorySeeded:
    if not store.has_run(run_id):
        raise SnapshotError(f"--memory-from: no run {run_id!r} in {store.path}")
    head_seq, head_chain = store.head(run_id)
    started: RunStarted | None = None
    events: list[dict[str, Any]] = []
    cases: dict[str, str] = {}
    for e in store.iter(run_id):
        if e.type == RunStarted.event_type:
            started = e.decode()  # type: ignore[assignment]
        elif e.type == MemorySeeded.event_type:
            # The source itself started from a snapshot: carry its memory along, still ordered
            # before the source's own events (its seqs are negative relative to the source).
            inner: MemorySeeded = e.decode()  # type: ignore[assignment]
            base = inner.source_seq + 1
            events += [dict(item, seq=item["seq"] - base) for item in inner.events]
            cases.update(inner.source_cases)
        elif e.type == CaseReceived.event_type:
            key = content_key(e.payload["case"])
            if key is not None and e.case_id is not None:
                cases.setdefault(e.case_id, key)
        elif e.type == EmbeddingsRecorded.event_type or payload_class(e.type).carries_memory:
            # (the source's recorded vectors too: the seeded memory is folded with them, on any machine)
            events.append({"seq": e.seq, "type": e.type, "schema_version": e.schema_version, "payload": e.payload})
    assert started is not None
    return MemorySeeded(source_run=run_id, source_seq=head_seq, source_chain=head_chain or "",
                        source_policy=started.policy_name, source_backbone=started.backbone, events=events,
                        source_cases=cases)


def source_of(seeded: MemorySeeded) -> dict[str, Any]:
    """What the test run's spec records about its starting memory."""
    return {"run_id": seeded.source_run, "seq": seeded.source_seq, "chain": seeded.source_chain}
