"""The DuckDB event log: append-only, gapless, atomic, optimistic concurrency, upcasting, chain."""

from __future__ import annotations

import threading

import pytest

from grandrounds.store import event_types as ev
from grandrounds.store.eventstore import ConcurrencyConflict, EventStore
from grandrounds.store.events import NewEvent, upcast


def _received(i: int) -> NewEvent:
    return NewEvent(ev.CaseReceived(index=i, case={"case_id": f"c{i}"}), case_id=f"c{i}",
                    meta={"host": "h", "t": i})


def test_append_assigns_gapless_seqs_and_reads_back(store: EventStore):
    store.append("r", [_received(0), _received(1)], expected_seq=-1)
    store.append("r", [_received(2)], expected_seq=1)
    events = store.read("r")
    assert [e.seq for e in events] == [0, 1, 2]
    assert events[2].decode() == ev.CaseReceived(index=2, case={"case_id": "c2"})
    assert events[0].meta == {"host": "h", "t": 0}
    assert store.runs()[0].last_seq == 2


def test_runs_are_independent_logs(store: EventStore):
    store.append("a", [_received(0)], expected_seq=-1)
    store.append("b", [_received(0), _received(1)], expected_seq=-1)
    assert [e.seq for e in store.read("a")] == [0]
    assert [e.seq for e in store.read("b")] == [0, 1]


def test_stale_expected_seq_is_a_conflict_and_writes_nothing(store: EventStore):
    store.append("r", [_received(0)], expected_seq=-1)
    with pytest.raises(ConcurrencyConflict, match="expected last seq -1"):
        store.append("r", [_received(1), _received(2)], expected_seq=-1)
    assert [e.seq for e in store.read("r")] == [0]


def test_a_failing_batch_leaves_no_partial_rows(store: EventStore):
    class Boom(ev.CaseReceived):
        def model_dump(self, **kw):  # the third event cannot be serialised
            raise RuntimeError("boom")

    batch = [_received(0), _received(1), NewEvent(Boom(index=2, case={}))]
    with pytest.raises(RuntimeError):
        store.append("r", batch, expected_seq=-1)
    assert store.read("r") == []
    store.append("r", [_received(0)], expected_seq=-1)  # the log is still usable from seq 0
    assert [e.seq for e in store.read("r")] == [0]


def test_racing_writers_exactly_one_wins(tmp_path):
    s = EventStore(tmp_path / "race.duckdb")
    s.append("r", [_received(0)], expected_seq=-1)
    for round_ in range(5):
        base = s.last_seq("r")
        barrier = threading.Barrier(2)
        results: list[object] = []

        def writer(tag: int) -> None:
            barrier.wait()
            try:
                s.append("r", [_received(100 + tag), _received(200 + tag)], expected_seq=base)
                results.append("ok")
            except ConcurrencyConflict as exc:
                results.append(exc)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count("ok") == 1, results
        assert sum(isinstance(r, ConcurrencyConflict) for r in results) == 1
        assert s.last_seq("r") == base + 2
    seqs = [e.seq for e in s.read("r")]
    assert seqs == list(range(len(seqs)))
    s.close()


def test_fingerprint_covers_payload_not_meta(tmp_path):
    a, b = EventStore(":memory:"), EventStore(":memory:")
    a.append("x", [NewEvent(ev.CaseCompleted(index=0, correct=True), meta={"t": 1.0})], -1)
    b.append("y", [NewEvent(ev.CaseCompleted(index=0, correct=True), meta={"t": 99.0, "host": "z"})], -1)
    assert a.fingerprint("x") == b.fingerprint("y")  # meta and run id are excluded
    b.append("y", [NewEvent(ev.CaseCompleted(index=1, correct=False))], 0)
    assert a.fingerprint("x") != b.fingerprint("y")


def test_store_api_has_no_update_or_delete():
    public = {n for n in dir(EventStore) if not n.startswith("_")}
    assert not {n for n in public if any(w in n for w in ("update", "delete", "remove", "truncate"))}


def test_v1_payload_is_upcast_to_v2_on_read(store: EventStore):
    v1 = {"answer": "B", "gold": "A", "correct": False, "rule_outcomes": [],
          "tool_outcomes": [{"tool": "xray", "helpful": False, "harmful": True},
                            {"tool": "lab", "helpful": True, "harmful": False},
                            {"tool": "old", "helpful": False, "harmful": False}]}
    # A v1 row as an older grandrounds wrote it, inserted behind the API.
    store.conn.execute(
        "INSERT INTO events VALUES ('r', 0, 'feedback.recorded', 1, 'c', NULL, ?, '{}', 'x')",
        [__import__("json").dumps(v1)])
    decoded = store.read("r")[0].decode()
    assert isinstance(decoded, ev.FeedbackRecorded)
    assert [(t.tool, t.outcome) for t in decoded.tool_outcomes] == [
        ("xray", "harmful"), ("lab", "helpful"), ("old", "neutral")]
    assert store.read("r")[0].payload == v1  # stored bytes are never rewritten
    with pytest.raises(ValueError, match="newer than this code"):
        upcast("feedback.recorded", 3, v1)


def test_hash_chain_detects_an_edit_behind_the_api(tmp_path):
    s = EventStore(tmp_path / "t.duckdb")
    s.append("r", [_received(i) for i in range(5)], -1)
    assert s.verify_chain("r") is None
    s.conn.execute("""UPDATE events SET payload = '{"case":{"case_id":"forged"},"index":2}'
                      WHERE run_id = 'r' AND seq = 2""")
    assert s.verify_chain("r") == 2
    s.close()


def test_import_rejects_altered_events(store: EventStore):
    src = EventStore(":memory:")
    stored = src.append("r", [_received(0), _received(1)], -1)
    store.import_events(stored)
    assert store.fingerprint("r") == src.fingerprint("r")
    other = EventStore(":memory:")
    forged = [stored[0], type(stored[1])(**{**stored[1].__dict__, "payload": {"index": 9, "case": {}}})]
    with pytest.raises(Exception, match="chain hash mismatch"):
        other.import_events(forged)
    assert other.read("r") == []


def test_import_rows_copies_rows_as_stored_and_rejects_an_altered_text(tmp_path):
    from grandrounds.store.read_model import EventLog

    src = EventStore(tmp_path / "src.duckdb")  # sealed, as a replay's scratch store is
    src.append("r", [_received(i) for i in range(4)], -1)
    rows = list(EventLog(src).stored_rows(["r"]))
    keys = tmp_path / "src.duckdb.keys"
    (tmp_path / "dst.duckdb.keys").write_bytes(keys.read_bytes())
    dst = EventStore(tmp_path / "dst.duckdb")
    dst.import_rows(rows[:2])
    dst.import_rows(rows[2:])  # continues the log where it is
    assert list(EventLog(dst).stored_rows(["r"])) == rows  # byte for byte
    assert dst.fingerprint("r") == src.fingerprint("r") and dst.verify_chain("r") is None

    other = EventStore(tmp_path / "other.duckdb")
    forged = [rows[0], (*rows[1][:6], rows[1][6].replace('"index":1', '"index":9'), *rows[1][7:])]
    assert forged[1] != rows[1]
    with pytest.raises(Exception, match="chain hash mismatch at seq 1"):
        other.import_rows(forged)
    with pytest.raises(Exception, match="not contiguous at seq 2"):
        other.import_rows([rows[0], rows[2]])
    with pytest.raises(Exception, match="not contiguous at seq 1"):
        other.import_rows(rows[1:])  # the log is empty: seq 0 must come first
    assert other.read("r") == []
    for s in (src, dst, other):
        s.close()


def test_group_commit_stores_each_partitions_position_new_or_known(store: EventStore):
    # A group commit stores several partitions' positions at once; the first time a partition
    # appears its row is created, later commits move it, and a rolled-back batch moves nothing.
    from grandrounds.store.eventstore import ConsumedOffset

    def pos(topic, partition, offset):
        return ConsumedOffset("g", topic, partition, offset)

    store.append_many([("r", [NewEvent(ev.CaseReceived(index=0, case={"case_id": "c0"}), case_id="c0")], -1)],
                      [pos("act", 0, 5)])
    store.append_many([("r", [NewEvent(ev.CaseCompleted(index=0, correct=True), case_id="c0")], 0)],
                      [pos("act", 0, 9), pos("act", 1, 3), pos("govern", 0, 2)])
    assert store.consumer_offsets("g") == {("act", 0): 9, ("act", 1): 3, ("govern", 0): 2}
    with pytest.raises(ConcurrencyConflict):
        store.append_many([("r", [NewEvent(ev.CaseCompleted(index=1, correct=True), case_id="c1")], 0)],
                          [pos("act", 0, 12), pos("act", 2, 1)])
    store.append_many([], [pos("act", 0, 10), pos("act", 1, 4), pos("govern", 0, 2)])
    assert store.consumer_offsets("g") == {("act", 0): 10, ("act", 1): 4, ("govern", 0): 2}


def test_prepared_rows_are_written_as_previewed_and_must_continue_the_log(tmp_path):
    # The Kafka worker publishes previewed rows to the changelog, then writes those same rows.
    a, b = EventStore(tmp_path / "a.duckdb"), EventStore(tmp_path / "b.duckdb")
    a.append("r", [_received(0), _received(1)], -1)
    b.append("r", [_received(0), _received(1)], -1)
    first = b.preview_after("r", [_received(2)], b.head("r"))
    second = b.preview_after("r", [_received(3), _received(4)], (first[-1].seq, first[-1].chain))
    b.append_prepared([("r", first, 1), ("r", second, 2)])  # consecutive steps in one transaction
    a.append("r", [_received(2)], 1)
    a.append("r", [_received(3), _received(4)], 2)
    assert b.fingerprint("r") == a.fingerprint("r") and b.verify_chain("r") is None
    # Rows previewed after a head the log has since moved past are refused, and nothing is written.
    stale = b.preview_after("r", [_received(5)], (first[-1].seq, first[-1].chain))
    with pytest.raises(ConcurrencyConflict):
        b.append_prepared([("r", stale, 4)])
    # Rows whose first link does not follow the head's chain (built on another log) are refused too.
    forged = b.preview_after("r", [_received(5)], (4, "0" * 64))
    with pytest.raises(ConcurrencyConflict):
        b.append_prepared([("r", forged, 4)])
    assert b.last_seq("r") == 4


class _SqlSpy:
    """Stands in for the store's DuckDB connection and records the SQL (and parameters) of every cursor it
    hands out."""

    def __init__(self, inner, log: list[str]):
        self._inner, self._log = inner, log

    def cursor(self):
        return _SqlSpy(self._inner.cursor(), self._log)

    def execute(self, sql, params=None):
        self._log.append((sql, params))
        self._inner.execute(sql, params)
        return self

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_iter_reads_in_pages_with_the_same_rows_and_filters(tmp_path, monkeypatch):
    """`iter` (replays, exports, the run summary's outcomes) reads `SCAN_PAGE` rows a query too: one
    ORDER BY over the whole selection sorted all of it at once (README "Flat memory"). Same rows, same
    order as one pass, with every filter, and rows appended while it reads are left out."""
    from grandrounds.store import eventstore, recorder  # noqa: F401  (settings live on recorder)

    s = EventStore(tmp_path / "i.duckdb", codec=None)
    for i in range(0, 10, 2):
        s.append("r", [_received(i), _received(i + 1)], i - 1)
    s.append("other", [_received(0)], -1)
    monkeypatch.setattr(recorder, "SCAN_PAGE", 3)
    sql: list[tuple] = []
    s._root = _SqlSpy(s._root, sql)

    def seqs(**kw) -> list[int]:
        return [e.seq for e in s.iter("r", **kw)]

    assert seqs() == list(range(10)) and seqs(after_seq=4, upto_seq=8) == [5, 6, 7, 8]
    assert seqs(case_id="c7") == [7] and seqs(types=["case.received"]) == list(range(10))
    assert seqs(types=["run.started"]) == [] and [e.seq for e in s.iter("none")] == []
    assert [e.decode().case["case_id"] for e in s.iter("r", upto_seq=2)] == ["c0", "c1", "c2"]
    scans = [(q, p) for q, p in sql if "ORDER BY seq" in q]
    # a window of seqs a query (not `LIMIT page`, which made DuckDB scan the rest of the run each page)
    assert len(scans) >= 4 + 2 + 1 + 4 and not any("LIMIT" in q for q, _ in scans), scans
    assert all(p[2] - p[1] <= 3 for q, p in scans if "seq > ? AND seq <= ?" in q), scans
    reading = s.iter("r")
    first = next(reading)
    s._root = s._root._inner
    s.append("r", [_received(10)], 9)  # appended mid-read: after the snapshot's last seq
    assert [first.seq, *(e.seq for e in reading)] == list(range(10))
    s.close()


def test_a_filtered_read_windows_over_the_span_of_its_rows_only(tmp_path, monkeypatch):
    """One case's events of a long run: its seqs' span is found first, then read in windows, rather than
    every window of the run being queried for the few rows of one case."""
    from grandrounds.store import eventstore, recorder  # noqa: F401  (settings live on recorder)

    s = EventStore(tmp_path / "w.duckdb", codec=None)
    s.append("r", [_received(i) for i in range(40)], -1)
    monkeypatch.setattr(recorder, "SCAN_PAGE", 3)
    sql: list[tuple] = []
    s._root = _SqlSpy(s._root, sql)
    assert [e.seq for e in s.iter("r", case_id="c31")] == [31]
    windows = [p for q, p in sql if "ORDER BY seq" in q]
    assert windows == [["r", 30, 31, "c31"]], sql  # one window, where the case's rows are
    assert [e.seq for e in s.iter("r", case_id="nobody")] == []
    s._root = s._root._inner
    s.close()


def test_whole_run_reads_go_in_pages_with_the_same_results(tmp_path, monkeypatch):
    """fingerprint and check_chain read a run `SCAN_PAGE` rows a query (one ORDER BY over a whole run
    made DuckDB sort all of it: ~7 KB of peak RSS a case, README "Flat memory"), and give what one
    pass over the rows gives, across page boundaries, with `upto_seq`, and on a damaged log."""
    import hashlib

    from grandrounds.store import eventstore, recorder  # noqa: F401  (settings live on recorder)

    s = EventStore(tmp_path / "p.duckdb", codec=None)
    for i in range(0, 10, 2):
        s.append("r", [_received(i), _received(i + 1)], i - 1)
    s.append("other", [_received(0)], -1)

    def by_hand(upto: int) -> str:
        h = hashlib.sha256()
        for e in s.read("r", upto_seq=upto):
            h.update(eventstore.event_line(e.seq, e.type, e.canonical_payload()).encode() + b"\n")
        return h.hexdigest()

    want = {upto: by_hand(upto) for upto in (9, 4, 5)}
    monkeypatch.setattr(recorder, "SCAN_PAGE", 3)
    sql: list[tuple] = []
    s._root = _SqlSpy(s._root, sql)
    assert s.fingerprint("r") == want[9]
    assert s.fingerprint("r", upto_seq=4) == want[4]
    assert s.fingerprint("r", upto_seq=5) == want[5]  # the page ends on the bound
    check = s.check_chain("r")
    assert (check.break_seq, check.events, check.head_seq) == (None, 10, 9)
    scans = [(q, p) for q, p in sql if "ORDER BY seq" in q]
    # a window of seqs a query (not `LIMIT page`, which made DuckDB scan the rest of the run each page)
    assert len(scans) >= 4 + 2 + 2 + 4 and not any("LIMIT" in q for q, _ in scans), scans
    assert all(p[2] - p[1] <= 3 for q, p in scans if "seq > ? AND seq <= ?" in q), scans
    assert s.fingerprint("empty") == hashlib.sha256().hexdigest() and s.check_chain("empty").events == 0
    s._root = s._root._inner
    s.conn.execute("DELETE FROM events WHERE run_id = 'r' AND seq = 4")  # behind the API
    check = s.check_chain("r")
    assert (check.break_seq, check.events) == (4, 4)
    s.close()


def test_a_fingerprint_kept_as_rows_are_appended_is_the_one_read_back(tmp_path):
    """`keep_fingerprints` (a replay's scratch store): the fingerprint folded from the rows as they are
    committed equals the one read back from the file, sealed rows opened, and a run that did not
    begin here (imported rows, then appends) is read back instead."""
    from grandrounds.store.read_model import EventLog

    def marked(i: int) -> NewEvent:  # a plaintext holding the sealed envelope's marker as text
        return NewEvent(ev.CaseReceived(index=i, case={"case_id": f"c{i}", "question": 'a "$sealed" note'}),
                        case_id=f"c{i}")

    path = tmp_path / "kept.duckdb"
    with EventStore(path) as store:
        assert store.codec is not None  # a file's rows are sealed: the case content is
        store.keep_fingerprints()
        store.append("r", [_received(0), marked(1)], -1)
        store.append("r", [NewEvent(ev.CaseCompleted(index=1, correct=True), case_id="c1")], 1)
        store.append("r", [_received(3), marked(4)], 2)
        kept = store.fingerprint("r")
        assert store._running["r"][0] == 4
        rows = list(EventLog(store).stored_rows(["r"]))
    with EventStore(path) as store:  # no kept state: every row read and opened
        assert store.fingerprint("r") == kept
    (tmp_path / "resumed.duckdb.keys").write_bytes((tmp_path / "kept.duckdb.keys").read_bytes())
    with EventStore(tmp_path / "resumed.duckdb") as resumed:
        resumed.keep_fingerprints()
        resumed.import_rows(rows[:3])
        resumed.append("r", [_received(3), marked(4)], 2)
        assert resumed._running["r"] is None and resumed.fingerprint("r") == kept
