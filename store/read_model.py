"""The read model: typed queries over the event log for every reader above the store.

Replay, audit, reports, the CLI and the benchmarks read events through `EventLog`, never through SQL of
their own: a stored row is decoded in one place, the store's mapper (`Mapper.decode`, store/mapper.py: the
row's columns, then its sealed case content opened, store/sealing.py), and its payload brought up to the
current schema version by the upcasters (`LogEvent.payload`), so an old log reads like
a new one everywhere. The queries are what those readers ask: a run's events in a seq range, as of a
case or a seq, by type, by case, the latest of a type, counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from grandrounds.store.eventstore import ROW_COLUMNS, EventStore
from grandrounds.store.events import EventPayload, StoredEvent, payload_class, upcast
from grandrounds.store.sealing import ContentErased

_FAR = 2**62


@dataclass(frozen=True)
class LogEvent(StoredEvent):
    """An event as readers see it: the stored event, its payload upcast to the current version of its
    type (`schema_version` says which: the current one); `meta` is wall clock, latency, host, how an
    exchange was served: never state."""

    @classmethod
    def of(cls, e: StoredEvent) -> "LogEvent":
        payload = upcast(e.type, e.schema_version, e.payload)
        return cls(e.run_id, e.seq, e.type, payload_class(e.type).schema_version, e.case_id, e.causation_seq,
                   payload, e.meta, e.chain)

    def model(self) -> EventPayload:
        """The payload as its typed model."""
        return payload_class(self.type).model_validate(self.payload)


class EventLog:
    """Queries on one store's runs. Cheap to make: holds nothing but the store."""

    _COLUMNS = ROW_COLUMNS

    def __init__(self, store: EventStore):
        self.store = store

    # --- events ----------------------------------------------------------------------------

    def events(self, run_id: str, *, after_seq: int = -1, upto_seq: int | None = None,
               types: Sequence[str] | None = None, case_ids: Iterable[str] | None = None,
               seqs: Iterable[int] | None = None, text: str | None = None, meta: bool = True,
               batch: int = 10_000) -> Iterator[LogEvent]:
        """The run's events in seq order, in (after_seq, upto_seq], optionally only of these types,
        of these cases, at these seqs, or whose stored payload JSON contains `text`. meta=False leaves
        `meta` empty (folds never read it, and decoding it costs)."""
        columns = self._COLUMNS if meta else self._COLUMNS.replace("meta", "'{}' AS meta")
        sql = f"SELECT {columns} FROM events WHERE run_id = ? AND seq > ? AND seq <= ?"
        params: list = [run_id, after_seq, _FAR if upto_seq is None else upto_seq]
        if types is not None:
            sql += " AND type IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(types))
        if case_ids is not None:
            sql += " AND case_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(case_ids))
        if seqs is not None:
            sql += " AND seq IN (SELECT unnest(?::BIGINT[]))"
            params.append(list(seqs))
        if text is not None:
            sql += " AND contains(CAST(payload AS VARCHAR), ?)"
            params.append(text)
        sql += " ORDER BY seq"
        decode = self.store.mapper.decode
        cur = self.store.conn.cursor()  # own cursor: the caller may query or write while iterating
        try:
            cur.execute(sql, params)
            while rows := cur.fetchmany(batch):
                for r in rows:
                    yield LogEvent.of(decode(r))
        finally:
            cur.close()

    def of_type(self, run_id: str, type_: str, *, upto_seq: int | None = None) -> list[LogEvent]:
        return list(self.events(run_id, types=[type_], upto_seq=upto_seq))

    def of_case(self, run_id: str, case_id: str, *, types: Sequence[str] | None = None) -> list[LogEvent]:
        return list(self.events(run_id, case_ids=[case_id], types=types))

    def latest(self, run_id: str, type_: str, *, upto_seq: int | None = None) -> LogEvent | None:
        """The run's most recent event of a type (at or before `upto_seq`)."""
        row = self.store.conn.execute(
            f"SELECT {self._COLUMNS} FROM events WHERE run_id = ? AND type = ? AND seq <= ? "
            "ORDER BY seq DESC LIMIT 1", [run_id, type_, _FAR if upto_seq is None else upto_seq]).fetchone()
        return None if row is None else LogEvent.of(self.store.mapper.decode(row))

    def first(self, run_id: str, type_: str) -> LogEvent | None:
        return next(self.events(run_id, types=[type_], batch=1), None)

    # --- counts ----------------------------------------------------------------------------

    def count(self, run_id: str, *, types: Sequence[str] | None = None, upto_seq: int | None = None) -> int:
        sql = "SELECT count(*) FROM events WHERE run_id = ? AND seq <= ?"
        params: list = [run_id, _FAR if upto_seq is None else upto_seq]
        if types is not None:
            sql += " AND type IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(types))
        return int(self.store.conn.execute(sql, params).fetchone()[0])

    def counts_by_type(self, run_id: str, *, upto_seq: int | None = None) -> dict[str, int]:
        rows = self.store.conn.execute(
            "SELECT type, count(*) FROM events WHERE run_id = ? AND seq <= ? GROUP BY type ORDER BY type",
            [run_id, _FAR if upto_seq is None else upto_seq]).fetchall()
        return {t: int(n) for t, n in rows}

    def seq_span(self, run_id: str, type_: str) -> tuple[int | None, int | None]:
        """(first, last) seq of the run's events of `type_`; (None, None) when it has none."""
        row = self.store.conn.execute("SELECT min(seq), max(seq) FROM events WHERE run_id = ? AND type = ?",
                                      [run_id, type_]).fetchone()
        return (row[0], row[1]) if row else (None, None)

    def completed_cases(self, run_id: str, *, upto_seq: int | None = None) -> int:
        return self.count(run_id, types=["case.completed"], upto_seq=upto_seq)

    # --- as of a case ------------------------------------------------------------------------

    def seq_after_case(self, run_id: str, index: int) -> int | None:
        """The seq of the run's `case.completed` for the case at `index` (memory as of that case), or None."""
        for e in self.events(run_id, types=["case.completed"]):
            if e.payload["index"] == index:
                return e.seq
        return None

    def case_indexes(self, run_id: str) -> dict[str, int]:
        """case_id -> its index in the run's stream (from `case.received`)."""
        return {e.case_id: int(e.payload["index"]) for e in self.events(run_id, types=["case.received"])}

    # --- runs side by side ---------------------------------------------------------------------

    def same_events(self, run_a: str, run_b: str) -> bool:
        """Whether two runs hold the same (seq, type, payload) events (their fingerprints' content)."""
        n_a, n_b = self.count(run_a), self.count(run_b)
        if n_a != n_b:
            return False
        matching = self.store.conn.execute(
            "SELECT count(*) FROM events a JOIN events b ON a.seq = b.seq AND a.type = b.type "
            "AND CAST(a.payload AS VARCHAR) = CAST(b.payload AS VARCHAR) WHERE a.run_id = ? AND b.run_id = ?",
            [run_a, run_b]).fetchone()[0]
        if int(matching) == n_a:
            return True
        # Sealed rows differ byte for byte between runs (the nonce and associated data name the run):
        # their plaintext is compared through the fingerprints, which cover exactly (seq, type, payload).
        if self.store.codec is None:
            return False
        try:
            return self.store.fingerprint(run_a) == self.store.fingerprint(run_b)
        except ContentErased:  # one side's plaintext is gone and no fingerprint was recorded for it
            return False

    def meta_counts(self, run_id: str, type_: str, key: str) -> dict[str | None, int]:
        """How many of the run's events of a type carry each value of one meta field."""
        rows = self.store.conn.execute(
            "SELECT meta->>?, count(*) FROM events WHERE run_id = ? AND type = ? GROUP BY 1",
            [f"$.{key}", run_id, type_]).fetchall()
        return {v: int(n) for v, n in rows}

    # --- rows as stored (export, moving a run between processes) --------------------------------

    def stored_rows(self, run_ids: Sequence[str], *, after_seq: int = -1, batch: int = 10_000) -> Iterator[tuple]:
        """Rows exactly as stored (payload and meta as their JSON text), by run then seq: for copying a
        log byte for byte (export, a worker process handing its events back). Not decoded, not upcast."""
        cur = self.store.conn.cursor()
        try:
            cur.execute(f"SELECT {self._COLUMNS} FROM events WHERE run_id IN (SELECT unnest(?::VARCHAR[])) "
                        "AND seq > ? ORDER BY run_id, seq", [list(run_ids), after_seq])
            while rows := cur.fetchmany(batch):
                yield from rows
        finally:
            cur.close()

    def copy_to_parquet(self, run_ids: Sequence[str], path: str) -> int:
        """Write the runs' rows as stored to a Parquet file; the number of rows."""
        ids = ", ".join("'" + rid.replace("'", "''") + "'" for rid in run_ids)
        target = str(path).replace("'", "''")
        self.store.conn.execute(f"COPY (SELECT {self._COLUMNS} FROM events WHERE run_id IN ({ids}) "
                                f"ORDER BY run_id, seq) TO '{target}' (FORMAT PARQUET)")
        return int(self.store.conn.execute("SELECT count(*) FROM events WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                                           [list(run_ids)]).fetchone()[0])

