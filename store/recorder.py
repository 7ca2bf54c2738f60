"""The recorder: rows in and out of the DuckDB file, and nothing of what a payload holds.

The events table's side of the store (as the eventsourcing library's persistence splits a store into a
mapper and a recorder; the mapper, store/mapper.py, turns events into rows and rows into events). One row
per event, `(run_id, seq)` primary key, seq gapless per run from 0. Appends and reads only: no update, no
delete. A stage's rows go in as one transaction and one multi-row INSERT over lists (single-row inserts
run at ~1k rows/s here, one batched INSERT at ~80k+, and `executemany` is not atomic). Writers use
optimistic concurrency: they state the last seq they saw and lose with `ConcurrencyConflict` if another
writer got there first. Kafka positions consumed by a stage are stored in the same transaction as its
rows (`consumer_offsets`). Whole-run reads go in windows of seqs (`_ordered`), and the process that has
the file to itself bounds what DuckDB keeps resident (`trim_cache`, `checkpoint_bounded`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Sequence

import duckdb

from grandrounds.store import integrity
from grandrounds.store.dbfile import check_db_file
from grandrounds.store.dbsettings import apply_settings, duckdb_settings
from grandrounds.store.errors import GrandroundsError, Retryable
from grandrounds.store.events import StoredEvent
from grandrounds.store.mapper import stored_row
from grandrounds.store.sealing import SUBJECT_REF_SQL


TRIM_TO = "16MB"
"""What `Recorder.trim_cache` lets DuckDB keep for that moment (rows awaiting a checkpoint included:
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
"""Rows per query when a whole run is read in seq order (`Recorder._ordered`): DuckDB sorts a
query's whole result, so the page bounds what one sort holds (2,048 rows of a 10k-case run: +23 MB
peak where the one query took +69 MB; benchmarks/bench_memory_breakdown.py)."""


ROW_COLUMNS = "run_id, seq, type, schema_version, case_id, causation_seq, payload, meta, chain"
"""The columns of `events` in the order a row tuple holds them (what the mapper decodes and builds)."""

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


BuildRows = Callable[[str, Sequence, tuple[int, str]], list[StoredEvent]]
"""What turns one batch into its rows: (run id, the batch, the run's head (last seq, chain value))."""


class Recorder:
    """The rows of append-only run logs in one DuckDB file (":memory:" for a throwaway store)."""

    def __init__(self, path: str | Path = ":memory:", read_only: bool = False):
        self.path = str(path)
        self.read_only = read_only
        """Opened read-only (verify, audit, export, ui): nothing, the embedding cache included, is written."""
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

    def __enter__(self):
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

    def _append_rows(self, batches: Sequence[tuple[str, Sequence, int]], consumed: Sequence[ConsumedOffset],
                     build: BuildRows, around: ContextManager) -> list[list[StoredEvent]]:
        """Each batch (run_id, events, expected_seq) turned into rows by `build` against the run's head,
        and all of them, with the Kafka positions `consumed`, written in one transaction: one INSERT, one
        COMMIT. A batch whose `expected_seq` is not the run's last seq (or that `build` finds does not
        continue the run) is a `ConcurrencyConflict`, and aborts them all. `around`: held while the rows
        are built (the mapper's key file writes)."""
        conn = self.conn
        conn.execute("BEGIN TRANSACTION")
        touched: dict[str, tuple[int, str]] = {}
        try:
            out: list[list[StoredEvent]] = []
            with around:
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
                    stored = build(run_id, events, head)
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
        return out

    @staticmethod
    def _insert_rows(conn, rows: Sequence[StoredEvent]) -> None:
        """One multi-row INSERT over column lists (not executemany: that is a statement a row), of the
        rows the mapper made (their JSON as it cached it)."""
        if not rows:
            return
        Recorder._insert_columns(conn, [list(c) for c in zip(*[stored_row(e) for e in rows])])

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

    def import_rows(self, rows: Sequence[tuple]) -> None:
        """Copy rows of one run exactly as another store holds them (`EventLog.stored_rows`: payload and
        meta as their JSON text), with no decoding: a replay hands its runs from the scratch store or a
        worker to the file this way. Seqs must continue the run's log exactly, and every chain hash is
        re-checked over the very texts that are written, so what lands is what was checked.
        """
        if not rows:
            return
        run_id = rows[0][0]
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

    # --- Kafka positions ---------------------------------------------------------------

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

    def _last_row_of_type(self, run_id: str, type_: str) -> tuple | None:
        """The row of the run's most recent event of one type."""
        return self.conn.execute(
            f"SELECT {ROW_COLUMNS} FROM events WHERE run_id = ? AND type = ? ORDER BY seq DESC LIMIT 1",
            [run_id, type_],
        ).fetchone()

    def _case_subject_ref(self, run_id: str, case_id: str) -> str | None:
        """The subject ref a case's content is sealed under (its `case.received` row's envelope)."""
        cur = self._root.cursor()
        try:
            row = cur.execute(
                f"SELECT {SUBJECT_REF_SQL} FROM events "
                "WHERE run_id = ? AND case_id = ? AND type = 'case.received' LIMIT 1", [run_id, case_id]).fetchone()
        finally:
            cur.close()
        return row[0] if row else None

    def consumer_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        rows = self.conn.execute(
            "SELECT topic, partition, next_offset FROM consumer_offsets WHERE group_id = ?", [group_id]
        ).fetchall()
        return {(r[0], int(r[1])): int(r[2]) for r in rows}
