"""`Session`: one run wired for execution — the composition root every driver shares.

`grandrounds run` (grandrounds/app.py), re-execution for `verify` and `replay` (replay/execute.py) and the
public API (grandrounds/api.py) all wire a run the same way: open it in the store (its `run.started`
written, or checked against the recorded one), build its backbone, attach the environment, drive the
embedded runner, and close what the run opened inside its event loop (model clients, a judge's
connections). Before this class each driver did that itself and they drifted: one closed the
environment's connections, the other did not. Here it is done once.

A session owns the backbone it builds and the loop-bound resources of the environment (`aclose`); the
environment itself (a FHIR sandbox, a process) stays with whoever opened it, since one environment
serves several runs of a replay. The store is the session's to close only when the session opened it
(`Session.open_file`); the embedding cache's new vectors are flushed when it closes.

The Kafka worker (streams/kafka_worker/) hosts many runs on one store: it opens the store and embedder
with `open_store`, as `open_file` does, and each run it takes up as a `Session` over them (`RunActor`),
whose backbone it closes (`aclose`) when it drops the run's state; it drives the run one stage per
message instead of through the session's embedded runner.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from grandrounds.handlers.cases import Case
from grandrounds.handlers.context import RunContext
from grandrounds.handlers.pipeline import CaseProgress, case_progress, process_case
from grandrounds.handlers.runs import RunSpec, open_run
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.event_types import CaseCompleted, CaseReceived, MemoryRetrieved, MemorySeeded
from grandrounds.store.eventstore import EventStore
from grandrounds.store.vector_index import single_threaded_blas
from grandrounds.streams.embedded import CommitMode, EmbeddedRunner, GroupCommit, Progress


def open_store(db: str | Path, codec: Any = "auto") -> tuple[EventStore, EmbeddingCache]:
    """A DuckDB file and, over it, this machine's shared embedder (the model loads on first use): what the
    sessions of a process run on. `codec`: as `EventStore` takes it ("auto": the file's own key file)."""
    store = EventStore(str(db), codec=codec)
    try:
        return store, EmbeddingCache(shared_minilm(), store.conn)
    except BaseException:
        store.close()
        raise


@dataclass(frozen=True)
class ProcessedCase:
    completed: CaseCompleted
    progress: CaseProgress
    """The stage outputs (memory shown, answer, feedback, reflection)."""
    events: list[tuple[int, str, dict]]
    """(seq, type, payload) of every event the case wrote, in order."""


class Session:
    """One run of `store`: its context (policy, backbone, live projection, writer), runner and environment."""

    def __init__(self, store: EventStore, cache: EmbeddingCache, ctx: RunContext, how: str,
                 runner: EmbeddedRunner, environment: Any = None, owns_store: bool = False):
        self.store = store
        self.cache = cache
        self.ctx = ctx
        self.how = how
        """How the projection was obtained: new, checkpoint or rebuild."""
        self.runner = runner
        self.environment = environment
        self._owns_store = owns_store
        self._closed = False

    @classmethod
    def open(cls, store: EventStore, cache: EmbeddingCache, run_id: str, spec: RunSpec, *,
             cases: int | None = None, backbone_options: dict | None = None, seeded: MemorySeeded | None = None,
             environment: Any = None, commit: CommitMode = "group", group: GroupCommit = GroupCommit(),
             checkpoint_every: int = 250, final_checkpoint: bool = True, owns_store: bool = False) -> "Session":
        """Create or resume `run_id` (`handlers.runs.open_run`: a refused configuration writes nothing).

        `cases`: the count a new run declares in `run.started` (None: an open-ended stream).
        `environment`: the tool-task environment the caller opened; its record goes to the `run.started`
        meta (never state), so the run can be verified and replayed in turn."""
        record = getattr(environment, "record", None)
        ctx, how = open_run(store, run_id, spec, cache, seeded=seeded,
                            started_meta=record.meta() if record is not None else None, cases=cases,
                            **(backbone_options or {}))
        ctx.environment = environment
        runner = EmbeddedRunner(ctx, commit=commit, checkpoint_every=checkpoint_every, group=group,
                                final_checkpoint=final_checkpoint)
        return cls(store, cache, ctx, how, runner, environment, owns_store)

    @classmethod
    def open_file(cls, db: str | Path, run_id: str, spec: RunSpec, **options: Any) -> "Session":
        """A session on a DuckDB file it opens (and closes), with this machine's shared embedder."""
        store, cache = open_store(db)
        try:
            return cls.open(store, cache, run_id, spec, owns_store=True, **options)
        except BaseException:
            store.close()
            raise

    @property
    def owns_store(self) -> bool:
        return self._owns_store

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    # --- driving -------------------------------------------------------------------------------

    async def run(self, cases: Sequence[Case], on_case: Progress | None = None) -> int:
        """Every case of `cases` the run has not completed yet, in order; returns how many ran now."""
        return await self.runner.run(cases, on_case=on_case)

    def preview_retrieval(self, case: Case) -> MemoryRetrieved:
        """The `memory.retrieved` the next case would record, read now without writing or folding anything
        (the public API shows it at `recall`, before the case's outcome exists). Faithful as long as nothing
        is folded before the case itself runs: the caller keeps the case the only one open.

        The de-identifier must know the case before retrieval scrubs its query (as `retrieve` has it emit
        `case.received` first), and must not keep the scrubber built now: the case's own run builds it
        again from the `case.received` it records (same inputs, same scrubber)."""
        ctx = self.ctx
        ctx.projection.state.check_open(ctx.run_id, case.case_id)  # as `retrieve` does, before anything is shown
        deid = ctx.writer.deidentifier
        if deid is not None:
            deid.observe(CaseReceived(index=ctx.projection.state.cases_completed, case=case.model_dump(mode="json")),
                         case.case_id)
        try:
            return ctx.mechanism.retrieve(ctx, case, ctx.projection.seq)
        finally:
            if deid is not None:
                deid.forget(case.case_id)  # built before case.received: it must not serve the case's memory events

    async def process(self, case: Case) -> ProcessedCase:
        """The next case of an open-ended stream (the public API), through every stage it still lacks,
        committed when it ends: the log holds it whole before the caller hears back. A case that raises
        leaves nothing written; the projection has folded its events then, so reopen the session."""
        state = self.ctx.projection.state
        index = state.cases_completed
        progress = None
        if state.cases_received > state.cases_completed:  # a case interrupted mid-way (a crash) resumes
            progress = case_progress(self.store, self.run_id, case.case_id)
            if not progress.started:
                raise ValueError(f"run {self.run_id!r}: an interrupted case is open; it is not {case.case_id!r}")
        progress = progress or CaseProgress()
        writer = self.ctx.writer
        boundary, first = len(writer.pending), writer.next_seq
        try:
            completed = await process_case(self.ctx, case, index, progress)
        except BaseException:
            del writer.pending[boundary:]
            raise
        events = [(first + i, e.type, e.payload_dict()) for i, e in enumerate(writer.pending[boundary:])]
        self.runner.flush()
        return ProcessedCase(completed, progress, events)

    async def aclose(self) -> None:
        """Close what the run opened inside its event loop: the backbone's clients, the environment's
        loop-bound connections (a separate judge's). Safe to call more than once."""
        for owner in (self.ctx.backbone, self.environment):
            close = getattr(owner, "aclose", None)
            if close is not None:
                await close()

    def execute(self, cases: Sequence[Case], on_case: Progress | None = None) -> int:
        """`run` in an event loop of its own, closing the loop-bound resources at its end (whatever happens),
        on one BLAS thread (vector arithmetic must not depend on the thread count)."""
        async def drive() -> int:
            try:
                return await self.run(cases, on_case)
            finally:
                await self.aclose()

        with single_threaded_blas():
            return asyncio.run(drive())

    def close(self) -> None:
        """Flush the embedding cache's new vectors; close the store if this session opened it."""
        if self._closed:
            return
        self._closed = True
        try:
            self.cache.flush()
        finally:
            if self._owns_store:
                self.store.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
