"""Executing runs for replay and verify: in this process or in worker processes.

A run is always executed into a scratch in-memory store and then imported into the target
file with `EventStore.import_rows`, which re-checks the hash chain. DuckDB allows one
writing process per file, so workers never open the target: each reads the target's
embedding cache from a temporary seed file (read-only, shared), executes into its own
memory and hands its events back; only the parent writes the target. (A temporary DuckDB
file per worker, read back by the parent, measured 2-3x slower per run here: the file
writes and JSON round trips cost more than executing the run.)
Both paths run the same `execute` over the same inputs, so where a run executed never
changes its events: workers only change the wall time. Replay runs are not checkpointed
(a later `open_projection` rebuilds them from the log).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Callable, Sequence

from grandrounds.handlers.cases import Case
from grandrounds.handlers.runs import RunSpec
from grandrounds.replay.orphans import die_with_parent
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.errors import InvalidInput
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog
from grandrounds.store.event_types import MemorySeeded
from grandrounds.store.events import StoredEvent
from grandrounds.store.keyring import KeyRing
from grandrounds.store.sealing import SealingCodec, subject_of
from grandrounds.store.projection import MemoryProjection, save_checkpoint
from grandrounds.streams.embedded import GroupCommit
from grandrounds.streams.session import Session

FLUSH_EVERY = 500
cache_embedder = shared_minilm  # the embedder replays use; the model loads only on a cache miss
START_ENV = "GRANDROUNDS_WORKER_START"
"""How replay workers start: `fork`, `spawn` or `forkserver` instead of the choice `start_method` makes."""


@dataclass(frozen=True)
class RunJob:
    """One run to execute: its id, spec and cases in the order it must see them."""

    run_id: str
    spec: RunSpec
    cases: tuple[Case, ...]
    seeded: MemorySeeded | None = None
    """Offline-mode runs: the memory they start from (the source run's `memory.seeded`)."""


@dataclass
class JobResult:
    run_id: str
    processed: int
    """Cases executed now (0 when the run was already complete in the target file)."""
    seconds: float
    embedding_misses: int = 0
    worker: bool = False
    fingerprint: str | None = None
    """The run's fingerprint as the scratch store that executed it kept it (None: read it from the file)."""


def execute(store: EventStore, cache: EmbeddingCache, run_id: str, spec: RunSpec,
            cases: Sequence[Case], backbone_options: dict | None = None,
            flush_every: int = FLUSH_EVERY, checkpoint: bool = True,
            seeded: MemorySeeded | None = None, environment=None,
            declared: int | None | str = "all") -> tuple[MemoryProjection, int]:
    """Create or resume `run_id` in `store` and process every case not yet completed.

    Into a scratch store, events are appended every `flush_every` cases (the embedded runner's
    group commit): nothing reads the scratch log while the run executes (the stages read the
    live projection), seqs are assigned at emit time, so the events are the same bytes as with
    a commit per stage, and a DuckDB transaction per case would cost more than the handlers
    themselves. A run interrupted in the middle of a case is finished by the embedded runner,
    which knows how to resume a case from its recorded stages. `environment`: the tool-task environment
    FHIR cases need (opened by the caller, as `grandrounds run` does). `declared`: the case count
    `run.started` declares — "all" (default) for len(cases); verify passes the recorded run's own
    (None for runs written before runs declared it), so the re-execution writes the same bytes.
    """
    # Group commit into the scratch store, by count only: nothing reads the scratch log while the
    # run executes, and the whole run is imported into the target at the end anyway. A tool-task run
    # records its environment in the `run.started` meta, as `grandrounds run` does (the Session's job),
    # so it can be verified and replayed in turn (meta: never part of the fingerprint).
    session = Session.open(store, cache, run_id, spec, cases=len(cases) if declared == "all" else declared,
                           backbone_options=backbone_options, seeded=seeded, environment=environment,
                           commit="group", checkpoint_every=0, final_checkpoint=False,
                           group=GroupCommit(cases=flush_every or 2**62, ms=float("inf")))
    ctx = session.ctx
    processed = session.execute(cases)  # the cache is the caller's to flush (run_here, the workers)
    if checkpoint and processed:
        save_checkpoint(store, run_id, ctx.projection)
    return ctx.projection, processed


def completed_cases(store: EventStore, run_id: str) -> int:
    return EventLog(store).completed_cases(run_id)


# --- in this process -----------------------------------------------------------------------


def run_here(target: EventStore, cache: EmbeddingCache, job: RunJob,
             backbone_options: dict | None = None, environment=None) -> JobResult:
    """Execute `job` here. A run that raises (a `ReplayDivergence`, say) leaves nothing in `target`.
    `environment`: the tool-task environment its FHIR cases need (opened by the caller)."""
    t0 = time.perf_counter()
    misses0 = cache.misses
    with EventStore(":memory:", codec=target.codec) as scratch:  # sealed as the target's rows are
        scratch.keep_fingerprints()
        existing = target.read(job.run_id)
        scratch.import_events(existing)
        _, processed = execute(scratch, cache, job.run_id, job.spec, job.cases, backbone_options=backbone_options,
                               checkpoint=False, seeded=job.seeded, environment=environment)
        # Rows as the scratch store holds them (the same codec sealed them): no decoding, no re-encoding.
        target.import_rows(list(EventLog(scratch).stored_rows([job.run_id],
                                                              after_seq=existing[-1].seq if existing else -1)))
        fingerprint = scratch.fingerprint(job.run_id)  # kept as it ran (the file's once imported: the same rows)
    target.checkpoint_if_due()  # bounded, rather than by DuckDB inside a later commit (`run_jobs` does the same)
    cache.flush()
    return JobResult(job.run_id, processed, time.perf_counter() - t0, cache.misses - misses0,
                     fingerprint=fingerprint)


# --- in worker processes -------------------------------------------------------------------


def start_method() -> str:
    """How worker processes start: `fork` where the platform has it, else `spawn`.

    A spawned worker is a new interpreter that imports grandrounds (~0.5 s here) before its first
    case, and runs its first cases with cold memos: at 400 cases that start-up made 2 workers
    slower than 1 (`benchmarks/bench_workers.py`). A forked one is a copy of this process, which
    has imported everything already, and starts in milliseconds.
    Fork is safe here because a worker uses nothing the parent's threads may hold: it opens its
    own in-memory DuckDB (never the parent's connection, whose threads are not copied) and ends
    with `os._exit` (multiprocessing's forked child), so no inherited destructor runs. It is not
    used once this process has loaded the embedding model: torch's thread pool does not survive
    a fork, and a worker that misses the cache would load the model through it.
    `GRANDROUNDS_WORKER_START` overrides (`spawn`, `fork` or `forkserver`).
    """
    chosen = os.environ.get(START_ENV, "").strip()
    available = get_all_start_methods()
    if chosen:
        if chosen not in available:
            raise InvalidInput(f"{START_ENV}={chosen!r}: this platform starts processes by "
                               f"{', '.join(available)}")
        return chosen
    model_loaded = getattr(cache_embedder(), "loaded", False)
    if "fork" in available and sys.platform.startswith("linux") and not model_loaded:
        return "fork"
    return "spawn"


def _worker(run_id: str, spec: dict, cases: list[dict], seed_path: str, existing: list[StoredEvent],
            seeded: dict | None = None, keys_path: str | None = None) -> dict:
    """Runs in a worker process (see `start_method`): execute one job into an in-memory store seeded from `seed_path`.

    Returns the new events and any vectors the worker had to embed; the parent imports both.
    """
    t0 = time.perf_counter()
    # The target's key file (read; the parent made every key these cases need): rows handed back sealed.
    codec = SealingCodec(KeyRing(keys_path, read_only=True)) if keys_path else None
    with EventStore(":memory:", codec=codec) as scratch:
        scratch.keep_fingerprints()
        conn = scratch.conn
        conn.execute(f"ATTACH '{seed_path}' AS gr_seed (READ_ONLY)")
        EmbeddingCache.copy_from(conn, "gr_seed")
        cache = EmbeddingCache(cache_embedder(), conn)
        cache.recorded.load_table(conn, "gr_seed.recorded_vectors")  # the vectors the parent's records hold
        scratch.import_events(existing)
        _, processed = execute(scratch, cache, run_id, RunSpec.model_validate(spec),
                               [Case.model_validate(c) for c in cases], checkpoint=False,
                               seeded=MemorySeeded.model_validate(seeded) if seeded else None)
        cache.flush()
        vectors = EmbeddingCache.rows_beyond(conn, "gr_seed")
        conn.execute("DETACH gr_seed")
        # Rows as stored (payload and meta as JSON text): pickling text is ~10x cheaper than
        # pickling the decoded payload dicts.
        rows = list(EventLog(scratch).stored_rows([run_id], after_seq=existing[-1].seq if existing else -1))
        # The whole run is here (what existed, imported, and what ran): its fingerprint is the one the
        # parent's file will give once these rows are imported (the same texts, the same keys), kept as the
        # rows were appended (`keep_fingerprints`), or read back for a run that resumed.
        fingerprint = scratch.fingerprint(run_id)
    return {"processed": processed, "seconds": time.perf_counter() - t0, "misses": cache.misses,
            "rows": rows, "vectors": vectors, "fingerprint": fingerprint}


def _seed_file(target: EventStore, cache: EmbeddingCache, path: Path) -> None:
    """A DuckDB file holding a copy of the target's embedding cache and of the recorded vectors the parent
    adopted (a replay's source run's): workers read it, never write."""
    conn = target.conn
    conn.execute(f"ATTACH '{path}' AS gr_seed")
    try:
        EmbeddingCache.copy_to(conn, "gr_seed")
        cache.recorded.save_table(conn, "gr_seed.recorded_vectors")
    finally:
        conn.execute("DETACH gr_seed")


def _keep_vectors(target: EventStore, rows: list[tuple]) -> None:
    """The vectors a worker had to embed (`EmbeddingCache.rows_beyond`), into the target's cache table."""
    EmbeddingCache.keep_rows(target.conn, rows)


def run_jobs(target: EventStore, cache: EmbeddingCache, jobs: Sequence[RunJob], workers: int = 1,
             on_done: Callable[[RunJob, JobResult], None] | None = None,
             backbone_options: Callable[[RunJob], dict] | None = None,
             environment=None) -> list[JobResult]:
    """Execute every job; runs already complete in `target` are left as they are.

    `backbone_options(job)`, when given, builds the backbone options of each job right before
    it executes (a model client, recorded exchanges that serving consumes): such jobs run in
    this process, one after the other — model clients are not sent to worker processes.
    `environment`, when given, is the tool-task environment (a FHIR sandbox) every job's cases
    are executed against: such jobs also run here, one after the other (a server is not sent to
    worker processes); each case gets fresh tools from it.
    """
    todo = [j for j in jobs if completed_cases(target, j.run_id) < len(j.cases)]
    todo_ids = {j.run_id for j in todo}
    results: dict[str, JobResult] = {}
    for j in jobs:
        if j.run_id not in todo_ids:
            results[j.run_id] = JobResult(j.run_id, 0, 0.0)
            if on_done:
                on_done(j, results[j.run_id])
    in_process = backbone_options is not None or environment is not None
    workers = 1 if in_process else max(1, min(workers, len(todo)))
    if workers == 1:
        for j in todo:
            results[j.run_id] = run_here(target, cache, j, backbone_options(j) if backbone_options else None,
                                         environment=environment)
            if on_done:
                on_done(j, results[j.run_id])
        return [results[j.run_id] for j in jobs]

    method = start_method()  # before anything is written: a bad GRANDROUNDS_WORKER_START changes nothing
    cache.flush()  # workers start from every vector this process knows
    keys_path = None
    if target.codec is not None:  # one writer of the key file: every subject's key made here, before the workers
        ring = target.codec.ring
        ring.ensure([ring.ref(subject_of(c.model_dump(mode="json"), c.case_id, j.run_id)) for j in todo for c in j.cases])
        keys_path = str(ring.path)
    tmp = Path(tempfile.mkdtemp(prefix="grandrounds-replay-"))
    try:
        seed = tmp / "seed.duckdb"
        _seed_file(target, cache, seed)
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context(method),
                                 initializer=die_with_parent, initargs=(os.getpid(),)) as pool, \
                warnings.catch_warnings():
            # Python 3.12+ warns that forking a process with threads may deadlock the child: see
            # `start_method` for why these children cannot (they touch nothing those threads hold).
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            pending = [(j, pool.submit(_worker, j.run_id, j.spec.model_dump(mode="json"),
                                       [c.model_dump(mode="json") for c in j.cases], str(seed),
                                       target.read(j.run_id),
                                       j.seeded.model_dump(mode="json") if j.seeded else None, keys_path))
                       for j in todo]
            for j, fut in pending:  # import in job order: the file's layout is deterministic too
                out = fut.result()
                target.import_rows(out["rows"])  # re-checks every chain hash over the texts it writes
                _keep_vectors(target, out["vectors"])
                # Into the file now, while the workers still run: a 2,500-case run's rows are ~30 MB of WAL,
                # and what was left for DuckDB took its checkpoints at a later import and at close, after the
                # last worker had finished (3.5 s of a 5 x 2,500 replay's wall was the close's checkpoint).
                target.checkpoint_if_due()
                results[j.run_id] = JobResult(j.run_id, out["processed"], out["seconds"], out["misses"], worker=True,
                                              fingerprint=out["fingerprint"])
                if on_done:
                    on_done(j, results[j.run_id])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [results[j.run_id] for j in jobs]
