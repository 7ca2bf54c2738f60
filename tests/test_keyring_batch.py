"""Subject keys written together: one fsync per append batch, and still on disk before their rows.

`EventStore.append` builds a batch's rows inside `KeyRing.deferred()`: the new subject keys (a case is
its own subject unless it names one) are appended to the key file with one write and one fsync when the
rows are built, before the COMMIT. Before, every new subject cost its own fsync.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from grandrounds.handlers.cases import Case
from grandrounds.store.event_types import CaseReceived
from grandrounds.store.events import NewEvent
from grandrounds.store.eventstore import EventStore
from grandrounds.store.keyring import KeyRing
from grandrounds.store.sealing import SEALED_KEY


def _received(n: int, start: int = 0) -> list[NewEvent]:
    cases = [Case(case_id=f"c{i}", kind="mcq", question=f"question {i}", options={"A": "x", "B": "y"},
                  answer="A") for i in range(start, start + n)]
    return [NewEvent(CaseReceived(index=i, case=c.model_dump(mode="json")), case_id=c.case_id)
            for i, c in enumerate(cases, start)]


def _refs_in_file(path) -> set[str]:
    return {json.loads(line)["ref"] for line in path.read_text().splitlines() if '"ref"' in line}


def test_a_batch_of_new_subjects_costs_one_fsync_and_its_keys_precede_the_commit(tmp_path, monkeypatch):
    db = tmp_path / "k.duckdb"
    keys = tmp_path / "k.duckdb.keys"
    with EventStore(db) as store:
        store.append("r", _received(1), -1)  # the key file and its header exist from here on
        synced: list[int] = []
        real_fsync = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
        seen_at_insert: list[set[str]] = []
        real_insert = EventStore._insert_rows

        def insert(conn, rows):  # what the key file holds when the rows go in (before the COMMIT)
            seen_at_insert.append(_refs_in_file(keys))
            return real_insert(conn, rows)

        monkeypatch.setattr(EventStore, "_insert_rows", staticmethod(insert))
        rows = store.append("r", _received(20, start=1), 0)
        monkeypatch.undo()
        assert len(synced) == 1, f"{len(synced)} fsyncs for 20 new subjects"
        refs = {json.loads(e.payload_json)[SEALED_KEY]["s"] for e in rows}
        assert len(refs) == 20 and refs <= seen_at_insert[0]
    with EventStore(db) as store:  # and every case reads back in clear
        assert [e.payload["case"]["question"] for e in store.read("r")][-1] == "question 20"


def test_keys_of_a_block_that_raised_are_written_by_the_next_writer(tmp_path):
    ring = KeyRing(tmp_path / "ring.keys")
    ring.ref("someone")  # creates the file
    with pytest.raises(RuntimeError):
        with ring.deferred():
            ring.ensure(["a" * 32])
            raise RuntimeError("the batch failed before its commit")
    assert "a" * 32 not in _refs_in_file(ring.path)  # nothing it sealed was committed
    ring.reload()  # another process's keys read in: the unwritten key is kept, not dropped
    assert ring.key("a" * 32) is not None
    ring.ensure(["b" * 32])
    assert {"a" * 32, "b" * 32} <= _refs_in_file(ring.path)
    again = KeyRing(ring.path)
    assert again.key("a" * 32) == ring.key("a" * 32)


def test_another_threads_ensure_of_a_pending_key_writes_it(tmp_path):
    ring = KeyRing(tmp_path / "ring.keys")
    ring.ref("someone")
    made, go_on = threading.Event(), threading.Event()

    def batch():
        with ring.deferred():
            ring.ensure(["c" * 32])
            made.set()
            go_on.wait(10)

    t = threading.Thread(target=batch)
    t.start()
    made.wait(10)
    assert "c" * 32 not in _refs_in_file(ring.path)
    ring.ensure(["c" * 32])  # not deferring: on return the key must be on disk, whoever made it
    assert "c" * 32 in _refs_in_file(ring.path)
    go_on.set()
    t.join()
    lines = [json.loads(x) for x in ring.path.read_text().splitlines()]
    assert sum(1 for x in lines if x.get("ref") == "c" * 32) == 1  # written once


def test_nested_blocks_write_at_the_outermost_end(tmp_path):
    ring = KeyRing(tmp_path / "ring.keys")
    ring.ref("someone")
    with ring.deferred():
        with ring.deferred():
            ring.ensure(["d" * 32])
        assert "d" * 32 not in _refs_in_file(ring.path)
    assert "d" * 32 in _refs_in_file(ring.path)
