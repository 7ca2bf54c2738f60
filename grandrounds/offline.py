"""Offline (train → frozen test) mode for `grandrounds run --memory-from RUN`."""

from __future__ import annotations

import os

from grandrounds.handlers.runs import RunSpec, read_spec
from grandrounds.store.event_types import MemorySeeded
from grandrounds.store.eventstore import EventStore
from grandrounds.store.snapshot import memory_snapshot, source_of


def seed_memory(store: EventStore, memory_db: str | None, run_id: str,
                spec: RunSpec) -> tuple[dict, MemorySeeded]:
    """The source run's memory for a run of `spec`; ValueError when it cannot serve that policy."""
    if memory_db and os.path.abspath(memory_db) != os.path.abspath(store.path):
        with EventStore(memory_db, read_only=True) as src:
            return _seed(src, run_id, spec)
    return _seed(store, run_id, spec)


def _seed(src: EventStore, run_id: str, spec: RunSpec) -> tuple[dict, MemorySeeded]:
    seeded = memory_snapshot(src, run_id)
    source_spec = read_spec(src, run_id)
    if source_spec is not None and source_spec.policy.name != spec.policy.name:
        raise ValueError(f"--memory-from: run {run_id!r} holds {source_spec.policy.name} memory; "
                         f"run it with --policy {source_spec.policy.name} (or a file of that policy)")
    return source_of(seeded), seeded
