"""The mapper: a stage's events into rows, and rows back into events. THE one reader of rows.

The store's two halves, as in the eventsourcing library's persistence (mapper / recorder): the recorder
(store/recorder.py) moves rows in and out of DuckDB and knows nothing of what a payload holds; this
module is all that knows a row's stored form.
- On write (`Mapper.build_rows`): each payload dumped, its case content sealed per subject
  (store/sealing.py), payload and meta as canonical JSON, and the row's chain link (store/integrity.py)
  over exactly those texts.
- On read (`Mapper.decode`): a row (the recorder's `ROW_COLUMNS`) as a `StoredEvent`, its sealed content opened
  (plaintext, or the erased stand-ins); the stored bytes stay in `payload_json`, for the chain and for
  copies. The read model, the fingerprint and erasure's checks all get a row's plaintext from here, so
  a sealed row is opened one way everywhere.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import replace
from typing import Callable, ContextManager, Sequence

from grandrounds.store import integrity
from grandrounds.store.canonical import canonical_json
from grandrounds.store.events import NewEvent, StoredEvent
from grandrounds.store.sealing import SEALED_KEY, SealingCodec, stored_form


def row_event(r: tuple) -> StoredEvent:
    """A row (`recorder.ROW_COLUMNS`) as the event it stores, payload as stored (sealed rows not opened)."""
    return StoredEvent(r[0], int(r[1]), r[2], int(r[3]), r[4], None if r[5] is None else int(r[5]),
                       json.loads(r[6]), json.loads(r[7]), r[8])


def stored_row(e: StoredEvent, trust_cached: bool = True) -> tuple:
    """The row (`recorder.ROW_COLUMNS`) an event is stored as: its payload in stored (sealed) form, payload and
    meta as canonical JSON. `trust_cached=False` serialises both again rather than use the JSON a writer
    cached on the event: rows from elsewhere (an import) are written, and checked, on what they hold."""
    payload = e.canonical_payload() if trust_cached else canonical_json(stored_form(e))
    meta = e.canonical_meta() if trust_cached else (canonical_json(e.meta) if e.meta else "{}")
    return (e.run_id, e.seq, e.type, e.schema_version, e.case_id, e.causation_seq, payload, meta, e.chain)


def chain_of(prev: str, e: StoredEvent, trust_cached: bool = True) -> str:
    """The chain value event `e` must carry after `prev`, by the rule (version) `prev` was made with."""
    return integrity.link(prev, integrity.version_of(prev), *stored_row(e, trust_cached)[:8])


def continues(head: tuple[int, str], first: StoredEvent) -> bool:
    """Whether a prepared row is the next one after `head` (its seq, and its chain link from the head's)."""
    return first.seq == head[0] + 1 and first.chain == chain_of(head[1], first)


def canonical_text(stored_json: str) -> str:
    """A stored JSON text in canonical form: what the chain covers, whatever whitespace the file holds."""
    return canonical_json(json.loads(stored_json))


def plaintext_of(e: StoredEvent) -> str:
    """The canonical JSON of an event's plaintext payload, for an event this mapper made (built or
    decoded): the stored text of a row not sealed (made by `canonical_json` from the same payload), made
    again from the opened payload of one that is (a plaintext merely holding the marker's text is made
    again too: the same text)."""
    stored = e.payload_json
    return stored if stored is not None and SEALED_KEY not in stored else canonical_json(e.payload)


class Mapper:
    """Rows to events and back under one codec (None: case content stored in clear)."""

    def __init__(self, codec: SealingCodec | None):
        self.codec = codec

    # --- write -------------------------------------------------------------------------

    def writing(self, prepared: bool = False) -> ContextManager:
        """Around building a transaction's rows: the subject keys they are sealed with reach the key file
        in one fsync, before the COMMIT (one per new subject cost ~0.2 ms each, a subject a case).
        Rows built elsewhere (`prepared`) made their keys there."""
        return self.codec.ring.deferred() if self.codec is not None and not prepared else nullcontext()

    def build_rows(self, run_id: str, events: Sequence[NewEvent], head: tuple[int, str],
                   subject_ref: Callable[[str, str], str | None]) -> list[StoredEvent]:
        """The rows `events` become after `head` (last seq, its chain value). `subject_ref(run_id, case_id)`:
        the subject a case's content is already sealed under (its `case.received` row's)."""
        seq, chain = head
        chain_version = integrity.version_of(chain)
        out = []
        for ev in events:
            seq += 1
            payload = ev.payload_dict()
            sealed = (self.codec.seal(run_id, seq, ev.type, ev.case_id, payload, subject_ref)
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

    # --- read --------------------------------------------------------------------------

    def decode(self, r: tuple) -> StoredEvent:
        """A row (`recorder.ROW_COLUMNS`) as an event, its payload opened: plaintext, or the erased stand-ins; the
        stored (sealed) bytes stay in `payload_json` for the chain and for copies."""
        e = row_event(r)
        if self.codec is None or SEALED_KEY not in e.payload:
            return e
        return replace(e, payload=self.codec.open(e.run_id, e.seq, e.type, e.payload),
                       payload_json=canonical_json(e.payload))

    def open_payload(self, run_id: str, seq: int, type_: str, payload_json: str) -> dict:
        """A stored payload text, opened: plaintext, or the erased stand-ins."""
        payload = json.loads(payload_json)
        if self.codec is not None and SEALED_KEY in payload:
            payload = self.codec.open(run_id, int(seq), type_, payload)
        return payload

    def plaintext_json(self, run_id: str, seq: int, type_: str, payload_json: str) -> str:
        """The canonical JSON of a stored payload's plaintext: the text itself unless it is sealed (nothing
        parsed: a fingerprint reads every row of a run). Sealed content that does not open raises
        (`ContentErased` once its subject is erased): there is no plaintext to give."""
        if self.codec is None or SEALED_KEY not in payload_json:
            return payload_json
        return canonical_json(self.codec.open(run_id, int(seq), type_, json.loads(payload_json), strict=True))

    def problem(self, run_id: str, seq: int, type_: str, payload_json: str) -> str | None:
        """Why a stored payload's sealed content does not open: "ciphertext_tampered" (not even JSON),
        "key_missing" (no codec here), or the codec's reason; None when it opens or nothing is sealed."""
        try:
            stored = json.loads(payload_json)
        except ValueError:
            return "ciphertext_tampered"
        if not isinstance(stored, dict) or SEALED_KEY not in stored:
            return None
        if self.codec is None:  # sealed rows and no codec (GRANDROUNDS_ENCRYPT=0): cannot be opened here
            return "key_missing"
        found = self.codec.problem(run_id, int(seq), type_, stored)
        return None if found is None else found.reason
