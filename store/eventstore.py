"""The append-only event log on DuckDB: the store every layer above writes and reads through.

One row per event, `(run_id, seq)` primary key, seq gapless per run from 0, appends and reads only
(store/recorder.py: the rows, their transactions, Kafka offsets, checkpoints). Writers use optimistic
concurrency: they state the last seq they saw and lose with `ConcurrencyConflict` if another writer got
there first.

Each event also carries `chain`, a sha256 linking it, and every column stored for it, to its
predecessor (`store.integrity`), so an edit made to the file behind the API's back is detectable
(`check_chain`).

With a `codec` (store/sealing.py; on by default for a database file) the case-content fields of a
payload are sealed per subject when a row is built and opened when it is read, both by the mapper
(store/mapper.py, the one reader of rows): the chain covers the stored (sealed) bytes, the fingerprint
(store/fingerprint.py) the plaintext, and callers only ever see plaintext (a read event keeps the stored
bytes in `payload_json`, so a copy of it is imported as stored).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from grandrounds.store import integrity, recorder
from grandrounds.store.erasure import recorded_fingerprint
from grandrounds.store.events import NewEvent, StoredEvent
from grandrounds.store.fingerprint import RunningFingerprints, event_line, read_back
from grandrounds.store.mapper import Mapper, canonical_text, chain_of, continues, stored_row
from grandrounds.store.recorder import (CHECKPOINT_AT, CHECKPOINT_MEMORY, LARGE_VALUE, ROW_COLUMNS, SCAN_PAGE,
                                        SCHEMA, TRIM_SCAN_PAGES, TRIM_TO, ConcurrencyConflict, ConsumedOffset,
                                        Recorder, RunInfo, StoreBusy, StoreError)
from grandrounds.store.sealing import SealingCodec, default_codec

__all__ = ["CHECKPOINT_AT", "CHECKPOINT_MEMORY", "GENESIS", "LARGE_VALUE", "ROW_COLUMNS", "SCAN_PAGE", "SCHEMA",
           "TRIM_SCAN_PAGES", "TRIM_TO", "ChainCheck", "ConcurrencyConflict", "ConsumedOffset", "EventStore",
           "RunInfo", "StoreBusy", "StoreError", "chain_of", "event_line"]

GENESIS = integrity.GENESIS_V1
"""The genesis of v1 chains (files written before the chain covered run id and meta)."""

# The recorder's settings (SCAN_PAGE, CHECKPOINT_AT, TRIM_TO, ...) are re-exported above for reading; they are
# read where they are used, so a test or benchmark that changes one sets it on store/recorder.py.


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


class EventStore(Recorder):
    """Append-only run logs in one DuckDB file (":memory:" for a throwaway store): the recorder's rows,
    made from events and read back as events by the mapper."""

    def __init__(self, path: str | Path = ":memory:", read_only: bool = False,
                 codec: SealingCodec | None | str = "auto"):
        codec = default_codec(str(path), read_only) if codec == "auto" else codec
        super().__init__(path, read_only)
        self.mapper = Mapper(codec)
        """Rows from events and events from rows, sealed content sealed and opened under `codec`."""
        self._kept: RunningFingerprints | None = None
        """Each run's fingerprint as its rows are appended here; off (None) unless `keep_fingerprints`."""

    @property
    def codec(self) -> SealingCodec | None:
        """Seals case content per subject (None: stored in clear). "auto": a file's own key file; a replay's
        scratch store is given its target's codec, so what it writes is sealed as the target's rows are."""
        return self.mapper.codec

    # --- writing -----------------------------------------------------------------------

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
        out = self._append_rows(batches, consumed, self._continuing if prepared else self._build_rows,
                                self.mapper.writing(prepared))
        if self._kept is not None:
            for stored in out:
                self._kept.appended(stored)
        return out

    @staticmethod
    def _continuing(run_id: str, rows: Sequence[StoredEvent], head: tuple[int, str]) -> list[StoredEvent]:
        """Rows built already (`append_prepared`), if they continue the log at `head`."""
        if rows and not continues(head, rows[0]):
            raise ConcurrencyConflict(
                f"run {run_id!r}: the prepared batch does not continue the log at seq {head[0]}; "
                "another writer appended first — reload and retry")
        return list(rows)

    def _build_rows(self, run_id: str, events: Sequence[NewEvent], head: tuple[int, str]) -> list[StoredEvent]:
        return self.mapper.build_rows(run_id, events, head, self._case_subject_ref)

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

    def import_events(self, events: Sequence[StoredEvent]) -> None:
        """Copy already-sequenced events of one run (from another store or a changelog) verbatim.

        Seqs must continue the run's log exactly; chain hashes are re-checked, so a copy
        cannot smuggle in altered payloads.
        """
        # What was checked is what is written: the JSON is made here from what each event holds, never
        # a text cached on a row from elsewhere. (A read event's payload is the opened plaintext: what
        # is written is its stored, sealed form.) Made once, for the check and the INSERT both.
        self.import_rows([stored_row(e, trust_cached=False) for e in events])

    def import_rows(self, rows: Sequence[tuple]) -> None:
        """`Recorder.import_rows`: rows of one run exactly as another store holds them, chains re-checked."""
        if rows and self._kept is not None:
            self._kept.forget(rows[0][0])  # rows not appended here: its fingerprint is read back
        super().import_rows(rows)

    # --- fingerprints ------------------------------------------------------------------

    def keep_fingerprints(self) -> None:
        """Keep each run's fingerprint as its rows are appended (`RunningFingerprints`), so `fingerprint`
        of a run written here whole needs no read back (a replay's scratch store)."""
        if self._kept is None:
            self._kept = RunningFingerprints()

    @property
    def _running(self) -> dict | None:
        """Per run, (last seq, fingerprint so far) as kept (`keep_fingerprints`), or None for a run read back."""
        return None if self._kept is None else self._kept.runs

    def fingerprint(self, run_id: str, upto_seq: int | None = None) -> str:
        """sha256 over the canonical JSON of (seq, type, payload) of the run's events; meta excluded
        (store/fingerprint.py): kept as the run was appended here, else read back."""
        if upto_seq is None and self._kept is not None:
            kept = self._kept.at(run_id, self.head(run_id)[0])
            if kept is not None:
                return kept
        return read_back(self._ordered("seq, type, payload", run_id, upto_seq=upto_seq), self.mapper, run_id,
                         lambda: recorded_fingerprint(self, run_id, upto_seq))

    # --- reading -----------------------------------------------------------------------

    def read(self, run_id: str, *selection, **by) -> list[StoredEvent]:
        """`iter`'s events, as a list."""
        return list(self.iter(run_id, *selection, **by))

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
        pages = self._ordered(ROW_COLUMNS, run_id, after_seq=after_seq, upto_seq=upto_seq,
                              page=max(1, min(batch, recorder.SCAN_PAGE)), where=where, params=params)
        try:
            for rows in pages:
                for r in rows:
                    yield self.mapper.decode(r)
        finally:
            pages.close()

    def last_of_type(self, run_id: str, type_: str) -> StoredEvent | None:
        """The run's most recent event of one type (e.g. the case now in flight)."""
        row = self._last_row_of_type(run_id, type_)
        return None if row is None else self.mapper.decode(row)

    def decode_row(self, r: tuple) -> StoredEvent:
        """A stored row (`ROW_COLUMNS`) as an event, its payload opened (`Mapper.decode`)."""
        return self.mapper.decode(r)

    def open_payload(self, run_id: str, seq: int, type_: str, payload_json: str) -> dict:
        """A payload read with SQL, opened: plaintext, or the erased stand-ins (`Mapper.open_payload`)."""
        return self.mapper.open_payload(run_id, seq, type_, payload_json)

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
                                           canonical_text(payload), canonical_text(meta))
                    if chain != stored:
                        return ChainCheck(version, int(seq), expected_seq + 1, int(seq), stored)
                    head_chain = stored
                    expected_seq += 1
        finally:
            pages.close()
        return ChainCheck(version, None, expected_seq, expected_seq - 1, head_chain)
