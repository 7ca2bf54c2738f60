"""Composition root: wires store, embeddings, handlers and a transport into a job."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from handlers.backbones import make_backbone
from handlers.cases import Case
from handlers.runs import RunSpec, open_run
from replay.metrics import run_summary
from store.embeddings import Embedder, EmbeddingCache, shared_minilm
from store.eventstore import EventStore
from streams.embedded import EmbeddedRunner


@dataclass
class RunOutcome:
    summary: dict
    processed_now: int
    projection_source: str
    note: str


def make_cache(store: EventStore, embedder: Embedder | None = None) -> EmbeddingCache:
    return EmbeddingCache(embedder or shared_minilm(), store.conn)


def unique_run_id(store: EventStore, base: str, spec: RunSpec) -> str:
    """The spec's default id; resumes a run with the same spec, never reuses a different one."""
    from handlers.runs import read_spec

    candidate, n = base, 1
    while store.has_run(candidate) and read_spec(store, candidate) != spec:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def run_cases(store: EventStore, cases: Sequence[Case], spec: RunSpec, run_id: str | None = None,
              cache: EmbeddingCache | None = None, commit: str = "stage",
              on_case: Callable[[int, bool], None] | None = None) -> RunOutcome:
    cache = cache or make_cache(store)
    rid = run_id or unique_run_id(store, spec.default_run_id(), spec)
    ctx, how = open_run(store, rid, spec, cache)
    runner = EmbeddedRunner(ctx, commit=commit)  # type: ignore[arg-type]
    try:
        processed = asyncio.run(runner.run(cases, on_case=on_case))
    finally:
        cache.flush()
    summary = run_summary(store, rid, ctx.projection.state)
    return RunOutcome(summary, processed, how, make_backbone(spec.backbone, spec.model).note)


def default_db() -> Path:
    return Path("grandrounds.duckdb")
