"""The append-only event log on DuckDB.

One row per event, `(run_id, seq)` primary key, seq gapless per run from 0. The API has
appends and reads only: no update, no delete. A stage's events go in as one transaction
and one multi-row INSERT over lists (single-row inserts run at ~1k rows/s here, one
batched INSERT at ~80k+, and `executemany` is not atomic). Writers use optimistic
concurrency: they state the last seq they saw and lose with `ConcurrencyConflict` if
another writer got there first.

Each event also carries `chain`, a sha256 linking it, and every column stored for it, to its
predecessor (`store.integrity`), so an edit made to the file behind the API's back is detectable
(`check_chain`).

With a `codec` (store/sealing.py; on by default for a database file) the case-content fields of a
payload are sealed per subject when a row is built and opened when it is read: the chain covers the
stored (sealed) bytes, the fingerprint the plaintext, and callers only ever see plaintext (a read
event keeps the stored bytes in `payload_json`, so a copy of it is imported as stored).
"""

from __future__ import annotations

from grandrounds.store.errors import GrandroundsError, Retryable
import hashlib
import json
import os
import threading
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb

from grandrounds.store import integrity
from grandrounds.store.canonical import canonical_json
from grandrounds.store.dbfile import check_db_file
from grandrounds.store.dbsettings import apply_settings, duckdb_settings
from grandrounds.store.events import NewEvent, StoredEvent
from grandrounds.store.sealing import SEALED_KEY, ContentErased, SealingCodec, default_codec, stored_form

TRIM_TO = "16MB"
"""What `EventStore.trim_cache` lets DuckDB keep for that moment (rows awaiting a checkpoint included:
they stay up to the 16 MB WAL threshold, and what does not fit is written to DuckDB's temp folder)."""

CHECKPOINT_AT = 12 * 2**20
"""WAL bytes from which `checkpoint_if_due` checkpoints: below DuckDB's own automatic threshold (16 MiB),
so a run that calls it at every group commit takes its checkpoints itself, bounded."""

CHECKPOINT_MEMORY = "16MB"
"""DuckDB's `memory_limit` while `checkpoint_bounded` checkpoints. At its usual limit (80 % of RAM) a
checkpoint's transient memory grew with the table: 226 MB of RSS at 12k cases, 470 MB at 53k (README,
"Flat memory"); bounded, it evicts as it writes (300k event-sized rows in one process: peak RSS 304 MB
at DuckDB's defaults, 141 bounded at 64MB, 112 at 32MB, 97 at 16MB; a whole 100k-case `grandrounds
run --policy none`: 179.8 MB at 32MB)."""

LARGE_VALUE = 2**20
"""A value this large written since the last checkpoint (a memory checkpoint blob) leaves the next
checkpoint to DuckDB, at its usual limit: a checkpoint pins each value whole, and one that cannot is
fatal to the database (it must be reopened)."""

TRIM_SCAN_PAGES = 16
"""A whole-run read by a store with `trim_scans` trims DuckDB's cache every this many pages."""

SCAN_PAGE = 2048
"""Rows per query when a whole run is read in seq order (`EventStore._ordered`): DuckDB sorts a
query's whole result, so the page bounds what one sort holds (2,048 rows of a 10k-case run: +23 MB
peak where the one query took +69 MB; benchmarks/bench_memory_breakdown.py)."""

GENESIS = integrity.GENESIS_V1
"""The genesis of v1 chains (files written before the chain covered run id and meta)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    run_id         VARCHAR NOT NULL,
    seq            BIGINT  NOT NULL,
    type           VARCHAR NOT NULL,
    schema_version INTEGER NOT NULL,
    case_id        VARCHAR,
    causation_seq  BIGINT,
    payload        JSON    NOT NULL,
    meta           JSON    NOT NULL,
    chain          VARCHAR NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS consumer_offsets (
    group_id    VARCHAR NOT NULL,
    topic       VARCHAR NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset BIGINT  NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
"""


class StoreError(GrandroundsError, RuntimeError):
    pass


class ConcurrencyConflict(StoreError, Retryable):
    """Another writer appended to the run after the seq this writer based its events on."""


class StoreBusy(StoreError, Retryable):
    """The DuckDB file is held by another process (DuckDB allows one writing process)."""


@dataclass(frozen=True)
class ConsumedOffset:
    """A Kafka position consumed by the stage whose events are appended with it."""

    group_id: str
    topic: str
    partition: int
    next_offset: int


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    events: int
    last_seq: int


def event_line(seq: int, type_: str, payload_json: str) -> str:
    """Canonical JSON of (seq, type, payload): the unit a run's fingerprint is computed over."""
    return f"[{seq},{json.dumps(type_, ensure_ascii=False)},{payload_json}]"


def _hash_event(h, seq: int, type_: str, payload_json: str) -> None:
    """One event's part of a run's fingerprint (`fingerprint`, and the one a store keeps as it appends)."""
    h.update(event_line(seq, type_, payload_json).encode("utf-8"))
    h.update(b"\n")


def chain_of(prev: str, e: StoredEvent, trust_cached: bool = True) -> str:
    """The chain value event `e` must carry after `prev`, by the rule (version) `prev` was made with.

    `trust_cached=False` re-serialises payload and meta instead of using the JSON a writer cached on
    the row: rows from elsewhere (an import) are checked on what they hold, not on what they claim."""
    payload = e.canonical_payload() if trust_cached else canonical_json(stored_form(e))
    meta = e.canonical_meta() if trust_cached else (canonical_json(e.meta) if e.meta else "{}")
    return integrity.link(prev, integrity.version_of(prev), e.run_id, e.seq, e.type, e.schema_version, e.case_id,
                          e.causation_seq, payload, meta)


def _continues(head: tuple[int, str], first: StoredEvent) -> bool:
    """Whether a prepared row is the next one after `head` (its seq, and its chain link from the head's)."""
    return first.seq == head[0] + 1 and first.chain == chain_of(head[1], first)


@dataclass(frozen=True)
class ChainCheck:
    """What recomputing a run's chain from its genesis found."""

    version: int | None
    """Chain version of the run (1: legacy, run id and meta not covered); None for no events."""
    break_seq: int | None
    """First seq whose stored chain value does not follow (or a missing seq); None when intact."""
    events: int
    """Rows read for the run."""
    head_seq: int
    head_chain: str | None
    """Last seq and its stored chain value (what a signed head names)."""


class EventStore:
    """Append-only run logs in one DuckDB file (":memory:" for a throwaway store)."""

    def __init__(self, path: str | Path = ":memory:", read_only: bool = False,
                 codec: SealingCodec | None | str = "auto"):
        self.path = str(path)
        self.read_only = read_only
        """Opened read-only (verify, audit, export, ui): nothing, the embedding cache included, is written."""
        self.codec: SealingCodec | None = default_codec(self.path, read_only) if codec == "auto" else codec
        """Seals case content per subject (None: stored in clear). "auto": a file's own key file; a replay's
        scratch store is given its target's codec, so what it writes is sealed as the target's rows are."""
        target = self.path
        if target != ":memory:":
            # A file, whatever its name: absolute (no DuckDB prefix such as md: can match), and a
            # DuckDB file if it exists (DuckDB would open a .json/.csv as a throwaway database).
            target = os.path.abspath(target)
            check_db_file(target)
        try:
            self._root = duckdb.connect(target, read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise StoreBusy(
                    f"{self.path} is in use by another process; DuckDB allows one writer per file "
                    "(stop that process, or give this one its own --db)"
                ) from exc
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        self._file = target
        self._largest_pending: float = 0
        """The largest single value written since this process last checkpointed (`checkpoint_bounded`)."""
        if target != ":memory:" and os.path.exists(target + ".wal") and os.path.getsize(target + ".wal"):
            self._largest_pending = float("inf")  # a WAL another process left: what it holds is unknown
        self._memory_limit: str | None = None
        """The `memory_limit` GRANDROUNDS_DUCKDB_SET gave (None: DuckDB's default), restored after a trim."""
        self._running: dict[str, tuple[int, Any] | None] | None = None
        """Per run, (last seq, sha256 so far) of its fingerprint, kept as rows are appended here; None for a
        run whose rows did not all come through `append` here. Off (None) unless `keep_fingerprints`."""
        self.trim_scans = False
        """Whether whole-run reads trim DuckDB's cache as they go (`trim_cache`): only for a process
        that has the database to itself on one thread (`grandrounds run`), see `trim_cache`."""
        if target != ":memory:":  # bounds on what DuckDB keeps resident (store/dbsettings.py)
            try:
                settings = duckdb_settings()
                apply_settings(self._root, settings)
                self._memory_limit = settings.get("memory_limit")
            except BaseException:
                self._root.close()
                raise
        if not read_only:
            self._root.execute(SCHEMA)
        self._local = threading.local()
        # run_id -> (last seq, chain at last seq) as this process last wrote or read it.
        self._heads: dict[str, tuple[int, str]] = {}
        self._heads_lock = threading.Lock()

    # --- connections -------------------------------------------------------------------

    @property
    def conn(self) -> duckdb.DuckDBPyConnection:
        """A connection for the calling thread (DuckDB connections are not thread-safe)."""
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._root.cursor()
            self._local.conn = c
        return c

    def close(self) -> None:
        self._root.close()

    def trim_cache(self) -> None:
        """Let go of the file blocks DuckDB keeps cached: lower `memory_limit` to `TRIM_TO`, which
        makes DuckDB evict unpinned blocks at once, then set it back. DuckDB otherwise keeps every
        block it read or wrote until `memory_limit` (80 % of RAM), so a long run held its whole file
        (README, "Flat memory"); a standing low limit would instead fail on any large single value.
        Evicted blocks are read back from the file when needed; no byte changes. Call it only when
        no other thread is using this database: for that moment its queries get `TRIM_TO`."""
        if self.path == ":memory:":
            return
        try:
            self._root.execute(f"SET memory_limit = '{TRIM_TO}'")
        except duckdb.Error:
            pass  # pinned blocks above TRIM_TO: what could be evicted was
        finally:
            self._restore_memory_limit()

    def _restore_memory_limit(self) -> None:
        if self._memory_limit is None:
            self._root.execute("RESET memory_limit")
        else:
            self._root.execute("SET memory_limit = ?", [self._memory_limit])

    def note_written(self, nbytes: int) -> None:
        """A value of `nbytes` went into the file outside `append` (a memory checkpoint blob): see
        `LARGE_VALUE`."""
        self._largest_pending = max(self._largest_pending, nbytes)

    def checkpoint_if_due(self) -> bool:
        """`checkpoint_bounded` once the WAL holds `CHECKPOINT_AT` bytes (a stat of the WAL file, no query).
        For a process that has the file to itself on one thread, as `trim_cache`."""
        if self.path == ":memory:":
            return False
        try:
            if os.path.getsize(self._file + ".wal") < CHECKPOINT_AT:
                return False
        except OSError:
            return False
        return self.checkpoint_bounded()

    def checkpoint_bounded(self) -> bool:
        """Move the WAL into the file now, with DuckDB's `memory_limit` at `CHECKPOINT_MEMORY` meanwhile:
        what sets a long run's peak RSS otherwise is DuckDB's automatic checkpoint, whose transient memory
        grows with the table. No byte of any row changes; only when the WAL is written into the file.
        Returns whether it ran bounded: with a large value pending (`LARGE_VALUE`) it checkpoints at the
        usual limit, as DuckDB would; on an error short of a fatal one (DuckDB's own checkpoint comes
        later) and in memory it does nothing. For a process that has the file to itself on one thread:
        for that moment another thread's query would get the limit."""
        if self.path == ":memory:":
            return False
        bounded = self._largest_pending <= LARGE_VALUE
        lowered = bounded and self._memory_limit is None  # a limit GRANDROUNDS_DUCKDB_SET gave is kept
        try:
            if lowered:
                self._root.execute(f"SET memory_limit = '{CHECKPOINT_MEMORY}'")
            self._root.execute("CHECKPOINT")
        except duckdb.FatalException:
            raise
        except duckdb.Error:
            return False  # pinned memory above the bound, or a transaction open: DuckDB checkpoints later
        finally:
            if lowered:
                self._restore_memory_limit()
        self._largest_pending = 0
        return bounded

    def __enter__(self) -> "EventStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- writing -----------------------------------------------------------------------

    @staticmethod
    def _read_head(conn, run_id: str) -> tuple[int, str]:
        row = conn.execute(
            "SELECT seq, chain FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1", [run_id]
        ).fetchone()
        return (int(row[0]), row[1]) if row else (-1, integrity.genesis(run_id))

    def head(self, run_id: str) -> tuple[int, str]:
        """(last seq, its chain hash) of a run; (-1, the run's genesis) when the run has no events."""
        head = self._read_head(self.conn, run_id)
        with self._heads_lock:
            self._heads[run_id] = head
        return head

    def last_seq(self, run_id: str) -> int:
        return self.head(run_id)[0]

    def append(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        expected_seq: int,
        consumed: ConsumedOffset | None = None,
    ) -> list[StoredEvent]:
        """Append `events` after `expected_seq` (the last seq the writer saw; -1 for a new run).

        All or nothing: one transaction, one INSERT. With `consumed`, the Kafka position is
        stored in the same transaction, so an event batch and its offset never part ways.
        """
        if not events and consumed is None:
            return []
        return self.append_many([(run_id, events, expected_seq)], [consumed] if consumed else ())[0]

    def append_many(self, batches: Sequence[tuple[str, Sequence[NewEvent], int]],
                    consumed: Sequence[ConsumedOffset] = ()) -> list[list[StoredEvent]]:
        """Several runs' batches (run_id, events, expected_seq) and Kafka positions in one transaction.

        The group commit of a worker serving many runs: one INSERT and one COMMIT for all, each
        batch still all-or-nothing (they all are). Same checks as `append`; a conflict on any
        batch aborts them all.
        """
        return self._append(batches, consumed, prepared=False)

    def append_prepared(self, batches: Sequence[tuple[str, Sequence[StoredEvent], int]],
                        consumed: Sequence[ConsumedOffset] = ()) -> list[list[StoredEvent]]:
        """`append_many` for rows already built by `preview` / `preview_after` (seqs, chain hashes).

        The Kafka worker builds each batch's rows once, to publish them to the changelog; writing
        those rows, rather than building them again on the commit thread, spares a second dump,
        canonical JSON and hash of every event. The checks are the same: each batch must continue
        the log where it stands (its first seq, and its first chain link recomputed from the head).
        """
        return self._append(batches, consumed, prepared=True)

    def _append(self, batches, consumed: Sequence[ConsumedOffset], prepared: bool) -> list[list[StoredEvent]]:
        conn = self.conn
        conn.execute("BEGIN TRANSACTION")
        touched: dict[str, tuple[int, str]] = {}
        # The subject keys the rows are sealed with reach the key file in one fsync when the batch is
        # built, before the COMMIT below (one per new subject cost ~0.2 ms each, a subject a case).
        keys_together = self.codec.ring.deferred() if self.codec is not None and not prepared else nullcontext()
        try:
            out: list[list[StoredEvent]] = []
            with keys_together:
                for run_id, events, expected_seq in batches:
                    head = touched.get(run_id)
                    if head is None:
                        with self._heads_lock:
                            head = self._heads.get(run_id)
                        if head is None or head[0] != expected_seq:
                            head = self._read_head(conn, run_id)
                    if head[0] != expected_seq:
                        raise ConcurrencyConflict(
                            f"run {run_id!r}: expected last seq {expected_seq}, the log is at {head[0]}; "
                            "another writer appended first — reload and retry"
                        )
                    stored = list(events) if prepared else self._build_rows(run_id, events, head)
                    if prepared and stored and not _continues(head, stored[0]):
                        raise ConcurrencyConflict(
                            f"run {run_id!r}: the prepared batch does not continue the log at seq {head[0]}; "
                            "another writer appended first — reload and retry")
                    if stored:
                        touched[run_id] = (stored[-1].seq, stored[-1].chain)
                    out.append(stored)
            rows = [e for stored in out for e in stored]
            self._insert_rows(conn, rows)
            self._largest_pending = max(self._largest_pending, max((len(e.canonical_payload()) for e in rows), default=0))
            self._write_offsets(conn, consumed)
            conn.execute("COMMIT")
        except ConcurrencyConflict:
            conn.execute("ROLLBACK")
            raise
        except (duckdb.ConstraintException, duckdb.TransactionException) as exc:
            self._rollback_quietly(conn)
            with self._heads_lock:
                for run_id, _, _ in batches:
                    self._heads.pop(run_id, None)
            runs = ", ".join(repr(r) for r, _, _ in batches)
            raise ConcurrencyConflict(f"another writer appended to run {runs} concurrently ({exc})") from exc
        except BaseException:
            self._rollback_quietly(conn)
            with self._heads_lock:
                for run_id, _, _ in batches:
                    self._heads.pop(run_id, None)
            raise
        with self._heads_lock:
            self._heads.update(touched)
        if self._running is not None:
            for stored in out:
                self._fold_fingerprint(stored)
        return out

    def keep_fingerprints(self) -> None:
        """Keep each run's fingerprint as its rows are appended, so `fingerprint` of a run written here
        whole needs no read. For a replay's scratch store: read back, every sealed row was opened again
        (decrypted, parsed, encoded) to hash its plaintext, ~8 % of a replayed run's time."""
        if self._running is None:
            self._running = {}

    def _fold_fingerprint(self, rows: Sequence[StoredEvent]) -> None:
        """`fingerprint`'s lines for rows just committed: the plaintext's canonical JSON, which is the stored
        text of a row not sealed (made by `canonical_json` from the same payload) and is made again from the
        payload of one that is (a plaintext merely holding the marker's text is made again too: the same)."""
        if not rows:
            return
        run_id = rows[0].run_id
        if run_id in self._running:
            state = self._running[run_id]
            if state is None or state[0] != rows[0].seq - 1:
                self._running[run_id] = None
                return
            h = state[1]
        elif rows[0].seq == 0:
            h = hashlib.sha256()
        else:  # the run began elsewhere (a resumed run): read back when asked
            self._running[run_id] = None
            return
        for e in rows:
            plain = e.payload_json if SEALED_KEY not in e.payload_json else canonical_json(e.payload)
            _hash_event(h, e.seq, e.type, plain)
        self._running[run_id] = (rows[-1].seq, h)

    def preview(self, run_id: str, events: Sequence[NewEvent], expected_seq: int) -> list[StoredEvent]:
        """The rows `append(run_id, events, expected_seq)` would write (seqs, chain hashes), without writing.

        Lets a transport publish a batch (a changelog) before committing it locally.
        """
        with self._heads_lock:
            cached = self._heads.get(run_id)
        head = cached if cached is not None and cached[0] == expected_seq else self.head(run_id)
        if head[0] != expected_seq:
            raise ConcurrencyConflict(f"run {run_id!r}: expected last seq {expected_seq}, the log is at {head[0]}")
        return self._build_rows(run_id, events, head)

    def preview_after(self, run_id: str, events: Sequence[NewEvent], head: tuple[int, str]) -> list[StoredEvent]:
        """The rows `events` get when appended after `head` (last seq, its chain hash); reads nothing.

        For a writer whose previous batch is on its way to the file but not in it yet (the Kafka
        worker's pipelined commits): the next batch chains onto that one.
        """
        return self._build_rows(run_id, events, head)

    @staticmethod
    def _insert_rows(conn, rows: Sequence[StoredEvent]) -> None:
        """One multi-row INSERT over column lists (not executemany: that is a statement a row)."""
        if not rows:
            return
        EventStore._insert_columns(conn, [list(c) for c in zip(*[
            (e.run_id, e.seq, e.type, e.schema_version, e.case_id, e.causation_seq,
             e.canonical_payload(), e.canonical_meta(), e.chain) for e in rows
        ])])

    @staticmethod
    def _insert_columns(conn, cols: list[list]) -> None:
        """The INSERT itself, over the nine columns of `events` as lists."""
        conn.execute(
            "INSERT INTO events SELECT * FROM (SELECT "
            "unnest(?::VARCHAR[]), unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::INTEGER[]), "
            "unnest(?::VARCHAR[]), unnest(?::BIGINT[]), unnest(?::JSON[]), unnest(?::JSON[]), "
            "unnest(?::VARCHAR[]))",
            cols,
        )

    @staticmethod
    def _rollback_quietly(conn) -> None:
        try:
            conn.execute("ROLLBACK")
        except duckdb.Error:
            pass  # DuckDB already aborted the transaction

    def _build_rows(self, run_id: str, events: Sequence[NewEvent], head: tuple[int, str]) -> list[StoredEvent]:
        seq, chain = head
        chain_version = integrity.version_of(chain)
        out = []
        for ev in events:
            seq += 1
            payload = ev.payload_dict()
            sealed = (self.codec.seal(run_id, seq, ev.type, ev.case_id, payload, self._case_subject_ref)
                      if self.codec is not None else None)
            payload_json = canonical_json(payload if sealed is None else sealed)
            meta = dict(ev.meta)
            meta_json = canonical_json(meta) if meta else "{}"
            version = ev.payload.schema_version
            chain = integrity.link(chain, chain_version, run_id, seq, ev.type, version, ev.case_id, ev.causation_seq,
                                   payload_json, meta_json)
            out.append(StoredEvent(run_id, seq, ev.type, version, ev.case_id, ev.causation_seq,
                                   payload, meta, chain, payload_json, meta_json))
        return out

    def import_events(self, events: Sequence[StoredEvent]) -> None:
        """Copy already-sequenced events of one run (from another store or a changelog) verbatim.

        Seqs must continue the run's log exactly; chain hashes are re-checked, so a copy
        cannot smuggle in altered payloads.
        """
        # What was checked is what is written: the JSON is made here from what each event holds, never
        # a text cached on a row from elsewhere. (A read event's payload is the opened plaintext: what
        # is written is its stored, sealed form.) Made once, for the check and the INSERT both.
        self.import_rows([(e.run_id, e.seq, e.type, e.schema_version, e.case_id, e.causation_seq,
                           canonical_json(stored_form(e)), canonical_json(e.meta) if e.meta else "{}", e.chain)
                          for e in events])

    def import_rows(self, rows: Sequence[tuple]) -> None:
        """Copy rows of one run exactly as another store holds them (`EventLog.stored_rows`: payload and
        meta as their JSON text), with no decoding: a replay hands its runs from the scratch store or a
        worker to the file this way. Seqs must continue the run's log exactly, and every chain hash is
        re-checked over the very texts that are written, so what lands is what was checked.
        """
        if not rows:
            return
        run_id = rows[0][0]
        if self._running is not None:
            self._running[run_id] = None  # rows not appended here: its fingerprint is read back
        seq, chain = self.head(run_id)
        if seq < 0 and integrity.version_of(rows[0][8]) == 1:
            chain = integrity.GENESIS_V1  # a legacy (v1) run copied verbatim keeps its chain
        version = integrity.version_of(chain)
        for r_run, r_seq, type_, schema_version, case_id, causation_seq, payload_json, meta_json, r_chain in rows:
            if r_run != run_id or r_seq != seq + 1:
                raise StoreError(f"import of {run_id!r} is not contiguous at seq {r_seq} (log at {seq})")
            chain = integrity.link(chain, version, run_id, r_seq, type_, schema_version, case_id, causation_seq,
                                   payload_json, meta_json)
            if chain != r_chain:
                raise StoreError(f"import of {run_id!r}: chain hash mismatch at seq {r_seq}")
            seq = r_seq
        conn = self.conn
        conn.execute("BEGIN TRANSACTION")
        try:
            cols = [list(c) for c in zip(*rows)]
            self._insert_columns(conn, cols)
            self._largest_pending = max(self._largest_pending, max(map(len, cols[6])))
            conn.execute("COMMIT")
        except (duckdb.ConstraintException, duckdb.TransactionException) as exc:
            self._rollback_quietly(conn)
            raise ConcurrencyConflict(f"run {run_id!r}: concurrent import ({exc})") from exc
        except BaseException:
            self._rollback_quietly(conn)
            raise
        with self._heads_lock:
            self._heads[run_id] = (int(rows[-1][1]), rows[-1][8])

    # --- reading -----------------------------------------------------------------------

    _COLUMNS = "run_id, seq, type, schema_version, case_id, causation_seq, payload, meta, chain"

    def read(
        self,
        run_id: str,
        after_seq: int = -1,
        upto_seq: int | None = None,
        types: Sequence[str] | None = None,
        case_id: str | None = None,
    ) -> list[StoredEvent]:
        return list(self.iter(run_id, after_seq, upto_seq, types, case_id))

    def iter(
        self,
        run_id: str,
        after_seq: int = -1,
        upto_seq: int | None = None,
        types: Sequence[str] | None = None,
        case_id: str | None = None,
        batch: int = 10_000,
    ) -> Iterator[StoredEvent]:
        # In pages (`_ordered`): one `ORDER BY seq` over the whole selection made DuckDB sort every row,
        # payloads included, before the first came back (reading a 10k-case run whole: +94 MB peak RSS,
        # README "flat memory"). Same rows, same order, the same snapshot (bounded at the last seq).
        where, params = "", []
        if types:
            where += " AND type IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(types))
        if case_id is not None:
            where += " AND case_id = ?"
            params.append(case_id)
        pages = self._ordered(self._COLUMNS, run_id, after_seq=after_seq, upto_seq=upto_seq,
                              page=max(1, min(batch, SCAN_PAGE)), where=where, params=params)
        try:
            for rows in pages:
                for r in rows:
                    yield self.decode_row(r)
        finally:
            pages.close()

    def _ordered(self, columns: str, run_id: str, after_seq: int | None = -1,
                 upto_seq: int | None = None, page: int | None = None, where: str = "",
                 params: Sequence = ()) -> Iterator[list[tuple]]:
        """A run's rows in seq order, a window of `page` seqs a query.

        One `ORDER BY seq` over a whole run makes DuckDB sort every row, payloads included, before
        the first comes back: a 10,000-case run's fingerprint raised peak RSS by ~70 MB, ~7 KB a
        case (README, flat memory). A window keeps only a page in the sort. Same rows, same order.
        The pages stop at the run's last seq when they start (`upto_seq` when given): rows up to
        there are never rewritten (append-only), so what a writer appends meanwhile is left out, as
        one query's snapshot would. `where` (with its `params`) narrows the rows further; the caller's
        SQL, never user text. Own cursor: the caller may write too."""
        page = SCAN_PAGE if page is None else page
        cur = self._root.cursor()
        if upto_seq is None:
            upto_seq = cur.execute("SELECT max(seq) FROM events WHERE run_id = ?", [run_id]).fetchone()[0]
            if upto_seq is None:
                cur.close()
                return
        # A window of seqs a query, not `seq > last ORDER BY seq LIMIT page`: to find the next `page` seqs
        # DuckDB had to scan every row after `last` (it does not know rows lie in seq order), so a whole
        # run cost a scan of the rest per page, quadratic (a 100k-case run's fingerprint: 21 s), and
        # pulled every later block into memory. A window's bounds let its zone maps skip all but the
        # blocks holding it. A run's seqs are contiguous, so a window holds `page` rows at most (fewer
        # with `where`); any row within (after_seq, upto_seq] is still read, gaps or not.
        sql = f"SELECT {columns} FROM events WHERE run_id = ? AND seq > ? AND seq <= ?{where} ORDER BY seq"
        first = f"SELECT {columns} FROM events WHERE run_id = ? AND seq <= ?{where} ORDER BY seq"
        low = after_seq
        if where and low is not None:  # a few rows of a long run (one case's): windows over their span only
            span = cur.execute(f"SELECT min(seq), max(seq) FROM events WHERE run_id = ? AND seq > ? AND seq <= ?{where}",
                               [run_id, low, upto_seq, *params]).fetchone()
            if span[0] is None:
                cur.close()
                return
            low, upto_seq = int(span[0]) - 1, int(span[1])
        try:
            windows = 0
            while low is None or low < upto_seq:
                windows += 1
                if self.trim_scans and windows % TRIM_SCAN_PAGES == 0:
                    self.trim_cache()  # the pages read so far are done with: keep the pool from holding the run
                high = min(upto_seq, (-1 if low is None else low) + int(page))
                if low is None:  # from any seq: a row with a negative one (tampering) is read too
                    query, args = first, [run_id, high, *params]
                else:
                    query, args = sql, [run_id, low, high, *params]
                rows = self._scan_page(cur, query, args) if self.trim_scans else cur.execute(query, args).fetchall()
                if rows:
                    yield rows
                low = high
        finally:
            cur.close()

    def _scan_page(self, cur, query: str, args: list) -> list[tuple]:
        """One page of a whole-run read with DuckDB's `memory_limit` at `TRIM_TO` meanwhile (a store with
        `trim_scans`: one thread, the file to itself). A page's rows sit in a row group of ~123k rows
        whose every block DuckDB would otherwise keep: reading a 20k-case run's outcomes at the end of
        `grandrounds run` took RSS from 157 to 191 MB. Bounded, DuckDB drops each block once read. A
        page that needs more (very large payloads in its top-N) is read again at the usual limit: a
        query's OutOfMemory, unlike a checkpoint's, leaves the database as it was."""
        lowered = self._memory_limit is None
        try:
            if lowered:
                self._root.execute(f"SET memory_limit = '{TRIM_TO}'")
            return cur.execute(query, args).fetchall()
        except duckdb.OutOfMemoryException:
            if lowered:
                self._restore_memory_limit()
                lowered = False
            return cur.execute(query, args).fetchall()
        finally:
            if lowered:
                self._restore_memory_limit()

    def runs(self) -> list[RunInfo]:
        rows = self.conn.execute(
            "SELECT run_id, count(*), max(seq) FROM events GROUP BY run_id ORDER BY run_id"
        ).fetchall()
        return [RunInfo(r[0], int(r[1]), int(r[2])) for r in rows]

    def has_run(self, run_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM events WHERE run_id = ? LIMIT 1", [run_id]).fetchone() is not None

    def fingerprint(self, run_id: str, upto_seq: int | None = None) -> str:
        """sha256 over the canonical JSON of (seq, type, payload) of the run's events; meta excluded."""
        if upto_seq is None and self._running is not None:
            kept = self._running.get(run_id)
            if kept is not None and kept[0] == self.head(run_id)[0]:
                return kept[1].copy().hexdigest()
        h = hashlib.sha256()
        rows = self._ordered("seq, type, payload", run_id, upto_seq=upto_seq)
        try:
            for page in rows:
                for seq, type_, payload in page:
                    if self.codec is not None and SEALED_KEY in payload:
                        # The fingerprint is over plaintext: the same on every machine, sealed or not.
                        try:
                            payload = canonical_json(self.codec.open(run_id, int(seq), type_, json.loads(payload),
                                                                     strict=True))
                        except ContentErased:
                            from grandrounds.store.erasure import recorded_fingerprint

                            return recorded_fingerprint(self, run_id, upto_seq)
                    _hash_event(h, int(seq), type_, payload)
        finally:
            rows.close()
        return h.hexdigest()

    def verify_chain(self, run_id: str) -> int | None:
        """First seq whose stored chain hash does not follow from its content, or None if intact."""
        return self.check_chain(run_id).break_seq

    def check_chain(self, run_id: str) -> ChainCheck:
        """Recompute the run's chain from its genesis over every stored column.

        The version is read from the first row's chain value (v2 values say so); every later row
        must follow by the same rule, so a log cannot switch rules part-way through.
        """
        version: int | None = None
        chain = ""
        expected_seq = 0
        head_chain: str | None = None
        pages = self._ordered("seq, type, schema_version, case_id, causation_seq, payload, meta, chain", run_id,
                              after_seq=None)
        try:
            for rows in pages:
                for seq, type_, schema, case_id, causation, payload, meta, stored in rows:
                    if version is None:
                        version = integrity.version_of(stored)
                        chain = integrity.genesis(run_id, version)
                    if int(seq) != expected_seq:
                        return ChainCheck(version, expected_seq, expected_seq, expected_seq - 1, head_chain)
                    chain = integrity.link(chain, version, run_id, int(seq), type_, int(schema), case_id,
                                           None if causation is None else int(causation),
                                           canonical_json(json.loads(payload)), canonical_json(json.loads(meta)))
                    if chain != stored:
                        return ChainCheck(version, int(seq), expected_seq + 1, int(seq), stored)
                    head_chain = stored
                    expected_seq += 1
        finally:
            pages.close()
        return ChainCheck(version, None, expected_seq, expected_seq - 1, head_chain)

    def save_offset(self, consumed: ConsumedOffset) -> None:
        """Store a Kafka position that carries no events (a skipped duplicate, a restore point)."""
        self._write_offset(self.conn, consumed)

    @classmethod
    def _write_offsets(cls, conn, consumed: Sequence[ConsumedOffset]) -> None:
        """Several Kafka positions (a group commit's partitions) with one UPDATE, not one each."""
        latest = {(c.group_id, c.topic, c.partition): c for c in consumed}  # last one wins, as in order
        if len(latest) <= 1:
            for c in latest.values():
                cls._write_offset(conn, c)
            return
        keys = list(latest)
        # No RETURNING (it doubled the statement's cost): the count says whether a row is missing,
        # which happens once per partition, the first time this file stores a position for it.
        updated = conn.execute(
            "UPDATE consumer_offsets SET next_offset = v.o FROM (SELECT unnest(?::VARCHAR[]) AS g, "
            "unnest(?::VARCHAR[]) AS t, unnest(?::INTEGER[]) AS p, unnest(?::BIGINT[]) AS o) AS v "
            "WHERE consumer_offsets.group_id = v.g AND consumer_offsets.topic = v.t "
            "AND consumer_offsets.partition = v.p",
            [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
             [latest[k].next_offset for k in keys]],
        ).fetchone()
        if updated and updated[0] == len(keys):
            return
        present = {(g, t, int(p)) for g, t, p in conn.execute(
            "SELECT group_id, topic, partition FROM consumer_offsets").fetchall()}
        for k in keys:
            if k not in present:
                conn.execute("INSERT INTO consumer_offsets VALUES (?, ?, ?, ?)", [*k, latest[k].next_offset])

    @staticmethod
    def _write_offset(conn, consumed: ConsumedOffset) -> None:
        # UPDATE first: the row exists after a partition's first message, and DuckDB's
        # INSERT OR REPLACE costs several times an UPDATE (ms per stage on the Kafka path).
        key = [consumed.group_id, consumed.topic, consumed.partition]
        updated = conn.execute(
            "UPDATE consumer_offsets SET next_offset = ? WHERE group_id = ? AND topic = ? AND partition = ?",
            [consumed.next_offset, *key],
        ).fetchone()
        if not updated or not updated[0]:
            conn.execute("INSERT INTO consumer_offsets VALUES (?, ?, ?, ?)", [*key, consumed.next_offset])

    def last_of_type(self, run_id: str, type_: str) -> StoredEvent | None:
        """The run's most recent event of one type (e.g. the case now in flight)."""
        row = self.conn.execute(
            f"SELECT {self._COLUMNS} FROM events WHERE run_id = ? AND type = ? ORDER BY seq DESC LIMIT 1",
            [run_id, type_],
        ).fetchone()
        return None if row is None else self.decode_row(row)

    def decode_row(self, r: tuple) -> StoredEvent:
        """A stored row as an event (`StoredEvent.from_row`), its payload opened: plaintext, or the erased
        stand-ins; the stored (sealed) bytes stay in `payload_json` for the chain and for copies."""
        e = StoredEvent.from_row(r)
        if self.codec is None or SEALED_KEY not in e.payload:
            return e
        return replace(e, payload=self.codec.open(e.run_id, e.seq, e.type, e.payload),
                       payload_json=canonical_json(e.payload))

    def open_payload(self, run_id: str, seq: int, type_: str, payload_json: str) -> dict:
        """A payload read with SQL, opened: plaintext, or the erased stand-ins (for readers of raw rows)."""
        payload = json.loads(payload_json)
        if self.codec is not None and SEALED_KEY in payload:
            payload = self.codec.open(run_id, int(seq), type_, payload)
        return payload

    def _case_subject_ref(self, run_id: str, case_id: str) -> str | None:
        """The subject ref a case's content is sealed under (its `case.received` row's envelope)."""
        cur = self._root.cursor()
        try:
            row = cur.execute(
                "SELECT json_extract_string(payload, '$.\"$sealed\".s') FROM events "
                "WHERE run_id = ? AND case_id = ? AND type = 'case.received' LIMIT 1", [run_id, case_id]).fetchone()
        finally:
            cur.close()
        return row[0] if row else None

    def consumer_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        rows = self.conn.execute(
            "SELECT topic, partition, next_offset FROM consumer_offsets WHERE group_id = ?", [group_id]
        ).fetchall()
        return {(r[0], int(r[1])): int(r[2]) for r in rows}
