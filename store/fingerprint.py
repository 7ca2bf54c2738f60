"""A run's fingerprint: sha256 over the canonical JSON of (seq, type, payload) of its events, meta excluded.

It covers the plaintext (`Mapper.plaintext_json` / `plaintext_of`, store/mapper.py), so it is the same on
every machine, sealed or not. `RunFingerprint` is its one producer: the fold a store keeps as it appends
(`RunningFingerprints`) and the read-back over a run's rows (`read_back`) both feed it, event by event,
so the two agree by construction. A run whose content was erased has no plaintext to hash any more: the
fingerprint recorded at the erasure stands in (store/erasure.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Iterable, Iterator

from grandrounds.store.events import StoredEvent
from grandrounds.store.mapper import Mapper, plaintext_of
from grandrounds.store.sealing import ContentErased


def event_line(seq: int, type_: str, payload_json: str) -> str:
    """Canonical JSON of (seq, type, payload): the unit a run's fingerprint is computed over."""
    return f"[{seq},{json.dumps(type_, ensure_ascii=False)},{payload_json}]"


class RunFingerprint:
    """The fingerprint of a run's events so far, folded one event at a time, in seq order."""

    __slots__ = ("_h", "last_seq")

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.last_seq = -1
        """The seq of the last event folded in (-1: none)."""

    def add(self, seq: int, type_: str, plaintext_json: str) -> None:
        """Fold in one event: its seq, type and the canonical JSON of its plaintext payload."""
        self._h.update(event_line(seq, type_, plaintext_json).encode("utf-8"))
        self._h.update(b"\n")
        self.last_seq = seq

    def add_events(self, events: Iterable[StoredEvent]) -> None:
        """Fold in events the mapper built or decoded (their plaintext is at hand: nothing is opened again)."""
        for e in events:
            self.add(e.seq, e.type, plaintext_of(e))

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def read_back(pages: Iterator[list[tuple]], mapper: Mapper, run_id: str,
              on_erased: Callable[[], str]) -> str:
    """The fingerprint of `pages` of (seq, type, payload) rows of `run_id` in seq order, each sealed row
    opened by `mapper`; `on_erased()` when content of the run is erased (the fingerprint recorded then)."""
    fp = RunFingerprint()
    try:
        for page in pages:
            for seq, type_, payload in page:
                try:
                    plain = mapper.plaintext_json(run_id, seq, type_, payload)
                except ContentErased:
                    return on_erased()
                fp.add(int(seq), type_, plain)
    finally:
        pages.close()
    return fp.hexdigest()


class RunningFingerprints:
    """Per run, the fingerprint of its rows as they are appended through one store, so that a run written
    there whole needs no read back (a replay's scratch store: read back, every sealed row was opened
    again, decrypted, parsed and encoded, to hash its plaintext: ~8 % of a replayed run's time)."""

    def __init__(self) -> None:
        self.runs: dict[str, tuple[int, RunFingerprint] | None] = {}
        """Run id -> (last seq folded, its fingerprint); None for a run whose rows did not all come
        through `appended` (it is read back when asked for)."""

    def appended(self, rows: list[StoredEvent]) -> None:
        """Rows of one run just committed, in seq order."""
        if not rows:
            return
        run_id = rows[0].run_id
        if run_id in self.runs:
            state = self.runs[run_id]
            if state is None or state[0] != rows[0].seq - 1:
                self.runs[run_id] = None
                return
            fp = state[1]
        elif rows[0].seq == 0:
            fp = RunFingerprint()
        else:  # the run began elsewhere (a resumed run): read back when asked
            self.runs[run_id] = None
            return
        fp.add_events(rows)
        self.runs[run_id] = (fp.last_seq, fp)

    def forget(self, run_id: str) -> None:
        """Rows of the run reached the store another way (an import): its fingerprint is read back."""
        self.runs[run_id] = None

    def at(self, run_id: str, last_seq: int) -> str | None:
        """The run's kept fingerprint if it covers the run up to `last_seq` (its head), else None."""
        kept = self.runs.get(run_id)
        return kept[1].hexdigest() if kept is not None and kept[0] == last_seq else None
