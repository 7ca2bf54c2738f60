"""One reader of rows, one producer of fingerprints, one owner of the embedding cache table.

The store is split as the eventsourcing library splits its persistence: the recorder moves rows
(store/recorder.py), the mapper turns events into rows and rows into events (store/mapper.py: the one
place a row is decoded and its sealed content opened), and a run's fingerprint has one producer
(store/fingerprint.py) that the running fold and the read-back both feed.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from grandrounds.store import event_types as ev
from grandrounds.store import eventstore, integrity, recorder
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.erasure import content_problems, erase_subject
from grandrounds.store.events import NewEvent, StoredEvent, payload_class, stored_columns
from grandrounds.store.eventstore import EventStore
from grandrounds.store.fingerprint import RunFingerprint
from grandrounds.store.mapper import Mapper, chain_of, stored_row
from grandrounds.store.read_model import EventLog, LogEvent
from grandrounds.store.sealing import ERASED, SEALED_KEY, ContentErased
from tests.llm_helpers import HashEmbedder

ROOT = Path(__file__).resolve().parent.parent


def _case(i: int, note: str = "") -> NewEvent:
    return NewEvent(ev.CaseReceived(index=i, case={"case_id": f"c{i}", "question": f"question {i} {note}"}),
                    case_id=f"c{i}", meta={"t": i})


def _done(i: int) -> NewEvent:
    return NewEvent(ev.CaseCompleted(index=i, correct=i % 2 == 0), case_id=f"c{i}")


def _write_run(store: EventStore, run_id: str = "r", cases: int = 4) -> None:
    seq = -1
    for i in range(cases):  # a plaintext holding the sealed envelope's marker as text, too
        rows = store.append(run_id, [_case(i, 'a "$sealed" note' if i == 1 else ""), _done(i)], seq)
        seq = rows[-1].seq


# --- one producer of fingerprints --------------------------------------------------------------


def test_the_running_fold_and_the_read_back_agree_on_a_sealed_run(tmp_path, monkeypatch):
    """Both paths feed `RunFingerprint.add` the same (seq, type, plaintext) lines: by construction."""
    fed: dict[str, list[tuple]] = {"kept": [], "read": []}
    path = "kept"
    real_add = RunFingerprint.add
    monkeypatch.setattr(RunFingerprint, "add", lambda self, *line: (fed[path].append(line), real_add(self, *line)))
    with EventStore(tmp_path / "s.duckdb") as store:
        assert store.codec is not None
        store.keep_fingerprints()
        _write_run(store)
        raw = store.conn.execute("SELECT string_agg(CAST(payload AS VARCHAR), ' ') FROM events").fetchone()[0]
        assert SEALED_KEY in raw and "question 2" not in raw  # the case content is sealed at rest
        kept = store.fingerprint("r")
        assert store._running["r"][0] == 7
    path = "read"
    with EventStore(tmp_path / "s.duckdb") as store:  # no kept state: every row read and opened
        assert store.fingerprint("r") == kept
    assert len(fed["kept"]) == 8 and fed["kept"] == fed["read"]
    assert all(SEALED_KEY not in plain or "note" in plain for _, _, plain in fed["read"])  # plaintext lines


def test_the_running_fold_and_the_read_back_agree_on_an_erased_run(tmp_path):
    db = tmp_path / "e.duckdb"
    with EventStore(db) as store:
        store.keep_fingerprints()
        _write_run(store)
        _write_run(store, "other", cases=2)
        kept = {r: store.fingerprint(r) for r in ("r", "other")}
    with EventStore(db) as store:  # the erasure records the fingerprint it reads back (the plaintext is there)
        erasure = erase_subject(store, "case:c2")
        assert erasure.runs == {"r": ["c2"]} and erasure.fingerprints == {"r": kept["r"]}
    with EventStore(db) as store:
        read = store.read("r")
        assert read[4].payload["case"] == {"erased": ERASED}  # erased: the stand-ins read back
        with pytest.raises(ContentErased):  # no plaintext to hash: the read-back takes the recorded one
            store.mapper.plaintext_json("r", 4, read[4].type, read[4].payload_json)
        assert store.fingerprint("r") == kept["r"] and store.fingerprint("other") == kept["other"]
        assert content_problems(store, "r") == {"erased": [4], "erased_cases": ["c2"]}
        # a run written since, beside the erased one: kept as appended and read back, the same
        store.keep_fingerprints()
        _write_run(store, "later", cases=3)
        later = store.fingerprint("later")
        assert store._running["later"] is not None
    with EventStore(db) as store:
        assert store.fingerprint("later") == later


# --- one reader of rows ---------------------------------------------------------------------------


def test_every_read_decodes_rows_through_the_mapper(tmp_path, monkeypatch):
    with EventStore(tmp_path / "m.duckdb") as store:
        _write_run(store, cases=2)
        decoded: list[int] = []
        real = Mapper.decode
        monkeypatch.setattr(Mapper, "decode", lambda self, r: (decoded.append(int(r[1])), real(self, r))[1])
        log = EventLog(store)
        assert [e.seq for e in log.events("r")] == [0, 1, 2, 3] and decoded == [0, 1, 2, 3]
        assert log.latest("r", "case.received").seq == 2 and decoded[-1] == 2
        assert [e.seq for e in store.read("r", upto_seq=1)] == [0, 1] and decoded[-2:] == [0, 1]
        assert store.last_of_type("r", "case.completed").seq == 3 and decoded[-1] == 3
        opened: list[int] = []
        real_plain = Mapper.plaintext_json
        monkeypatch.setattr(Mapper, "plaintext_json",
                            lambda self, run_id, seq, *a: (opened.append(seq), real_plain(self, run_id, seq, *a))[1])
        store.fingerprint("r")
        assert opened == [0, 1, 2, 3]
        asked: list[int] = []
        monkeypatch.setattr(Mapper, "problem", lambda self, run_id, seq, *a: asked.append(seq))
        assert content_problems(store, "r") == {} and asked == [0, 2]  # the sealed rows, through the mapper


def test_a_row_decodes_to_the_event_it_was_built_from_and_back_to_its_bytes(tmp_path):
    with EventStore(tmp_path / "b.duckdb") as store:
        built = store.append("r", [_case(0), _case(1, 'a "$sealed" note'), _done(1)], -1)
        rows = list(EventLog(store).stored_rows(["r"]))
        prev = store.head("r")[1]
        for r, e in zip(rows, built):
            read = store.mapper.decode(r)
            assert read == e and read.payload == e.payload  # plaintext, the envelope as built
            assert stored_row(read, trust_cached=False) == r  # the stored bytes, re-made from the read event
            assert chain_of(integrity.genesis("r") if r[1] == 0 else rows[r[1] - 1][8], read,
                            trust_cached=False) == r[8]
        assert prev == rows[-1][8]
        logged = list(EventLog(store).events("r"))
        assert all(isinstance(e, LogEvent) and isinstance(e, StoredEvent) for e in logged)
        assert all(e.schema_version == payload_class(e.type).schema_version for e in logged)  # upcast to current


def test_a_changelog_event_carries_the_stored_columns():
    from grandrounds.streams.changelog import encode_batch
    from grandrounds.streams.messages import ChangelogBatch, ChangelogEvent

    assert list(ChangelogEvent.model_fields) == [n for n in stored_columns() if n != "run_id"]
    with EventStore(":memory:") as store:
        built = store.append("r", [_case(0), _done(0)], -1)
    batch = ChangelogBatch.model_validate_json(encode_batch(built)[0])
    assert [(e.seq, e.chain, e.payload) for e in batch.events] == [(e.seq, e.chain, e.payload) for e in built]


# --- the embedding cache table, through its class only ------------------------------------------------


def test_the_embedding_cache_table_is_reached_only_through_its_class():
    sql = re.compile(r"(FROM|INTO|TABLE|JOIN|EXISTS)\s+(\w+\.)?embedding_cache\b", re.IGNORECASE)
    found = [str(p.relative_to(ROOT)) for d in ("store", "handlers", "streams", "replay", "sandbox", "grandrounds")
             for p in (ROOT / d).rglob("*.py")
             if p != ROOT / "store" / "embeddings.py" and sql.search(p.read_text(encoding="utf-8"))]
    assert found == []


def test_cache_rows_copy_between_files_through_the_class(tmp_path):
    seed = tmp_path / "seed.duckdb"
    parent = duckdb.connect(":memory:")
    cache = EmbeddingCache(HashEmbedder(), parent, machine=None)
    cache.get("alpha text")
    cache.get("beta words")
    assert cache.flush() == 2
    parent.execute(f"ATTACH '{seed}' AS gr_seed")
    EmbeddingCache.copy_to(parent, "gr_seed")
    parent.execute("DETACH gr_seed")
    worker = duckdb.connect(":memory:")
    worker.execute(f"ATTACH '{seed}' AS gr_seed (READ_ONLY)")
    EmbeddingCache.copy_from(worker, "gr_seed")
    there = EmbeddingCache(HashEmbedder(), worker, machine=None)
    assert there.get("alpha text").tolist() == cache.get("alpha text").tolist() and there.misses == 0
    there.get("gamma new text")
    there.flush()
    new = EmbeddingCache.rows_beyond(worker, "gr_seed")
    assert [r[0] for r in new] == [there.key("gamma new text")] and new[0][1] == there.model
    EmbeddingCache.keep_rows(parent, new)
    EmbeddingCache.keep_rows(parent, new)  # a key the file holds keeps its row
    EmbeddingCache.keep_rows(parent, [])
    back = EmbeddingCache(HashEmbedder(), parent, machine=None)
    assert back.get("gamma new text").tolist() == there.get("gamma new text").tolist() and back.misses == 0
    assert parent.execute("SELECT count(*) FROM embedding_cache").fetchone()[0] == 3
