"""Per-case state that must not pile up as a run grows (issue 17 item 4): the sealing codec's caches stay
bounded, and a case they dropped is still sealed under its own subject (via the store's lookup)."""

from __future__ import annotations

from grandrounds.store import sealing
from grandrounds.store.keyring import KeyRing
from grandrounds.store.sealing import SealingCodec


def test_sealing_caches_stay_bounded_and_evicted_cases_keep_their_subject(tmp_path, monkeypatch):
    monkeypatch.setattr(sealing, "CACHE_LIMIT", 16)
    ring = KeyRing(tmp_path / "keys")
    codec = SealingCodec(ring)
    received: dict[tuple[str, str], str] = {}  # what the store would answer: the ref of each case.received

    def lookup(run_id: str, case_id: str) -> str | None:
        return received.get((run_id, case_id))

    for i in range(200):
        case = {"case_id": f"c{i}", "question": "q", "subject": f"patient-{i % 7}"}
        out = codec.seal("r", 2 * i, "case.received", f"c{i}", {"case": case}, lookup)
        received[("r", f"c{i}")] = out["$sealed"]["s"]
    assert len(codec._refs) <= 16 and len(codec._aead) <= 16
    # case c0 left the caches long ago: its answer still goes under patient-0's key, not "case:c0"
    out = codec.seal("r", 999, "answer.given", "c0", {"answer": "A", "steps": []}, lookup)
    assert out["$sealed"]["s"] == ring.ref("patient-0") != ring.ref("case:c0")
    assert codec.open("r", 999, "answer.given", out)["answer"] == "A"


def test_embedding_cache_keeps_recent_vectors_and_reads_the_rest_from_the_file(tmp_path):
    import numpy as np

    from grandrounds.store.embeddings import EmbeddingCache
    from grandrounds.store.eventstore import EventStore
    from tests.llm_helpers import HashEmbedder

    with EventStore(tmp_path / "e.duckdb") as store:
        cache = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        cache.memory_limit = 8
        texts = [f"text number {w} about alpha{w} beta{w}" for w in ("one two three four five six seven eight "
                                                                     "nine ten eleven twelve thirteen").split()]
        first = {t: cache.get(t).copy() for t in texts}
        assert cache.misses == len(texts) and len(cache._mem) == 8
        assert np.array_equal(cache.get(texts[0]), first[texts[0]]) and cache.misses == len(texts)  # from _pending
        cache.flush()
        again = {t: cache.get(t) for t in texts}  # the evicted ones come back from the file, bit for bit
        assert cache.misses == len(texts) and len(cache._mem) == 8
        assert all(np.array_equal(again[t], first[t]) for t in texts)
        fresh = EmbeddingCache(HashEmbedder(), store.conn, machine=None)  # a new process: the file has them all
        assert all(np.array_equal(fresh.get(t), first[t]) for t in texts) and fresh.misses == 0


def test_a_run_writes_new_vectors_with_each_group(tmp_path):
    from grandrounds.app import run_cases
    from grandrounds.handlers.cases import Case
    from grandrounds.handlers.policies.config import load_policy
    from grandrounds.handlers.runs import RunSpec
    from grandrounds.store.embeddings import EmbeddingCache
    from grandrounds.store.eventstore import EventStore
    from grandrounds.streams.embedded import GroupCommit
    from tests.llm_helpers import HashEmbedder

    words = "heart lung liver kidney brain bone skin blood nerve muscle eye ear".split()
    cases = [Case(case_id=f"c{i}", kind="mcq", question=f"Which {words[i % 12]} finding {words[(i * 5) % 12]} "
                  f"case{i}?", options={"A": "yes", "B": "no"}, answer="A") for i in range(40)]
    pending: list[int] = []
    with EventStore(tmp_path / "r.duckdb") as store:
        cache = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        run_cases(store, cases, RunSpec(policy=load_policy("evo-medagent")), run_id="r", cache=cache,
                  group=GroupCommit(cases=4, ms=1e9), on_case=lambda i, ok: pending.append(len(cache._pending)))
        assert cache.misses >= 40 and max(pending) <= 4 * (cache.misses // 40 + 2)  # a group's vectors, not the run's


def test_deidentifier_keeps_the_recent_cases_only():
    from grandrounds.handlers.deidentify import Deidentifier
    from grandrounds.store.event_types import CaseReceived

    d = Deidentifier(store=None, run_id="r")
    for i in range(1000):  # a policy that writes no memory never asks for a scrubber, which also trimmed
        d.observe(CaseReceived(index=i, case={"case_id": f"c{i}", "question": "q"}), f"c{i}")
    assert len(d._cases) <= 256 and "c999" in d._cases


def test_checkpoints_thin_out_as_the_run_grows(tmp_path, monkeypatch):
    import asyncio

    import grandrounds.streams.embedded as embedded
    from grandrounds.handlers.cases import Case
    from grandrounds.handlers.policies.config import load_policy
    from grandrounds.handlers.runs import RunSpec, open_run
    from grandrounds.store.embeddings import EmbeddingCache
    from grandrounds.store.eventstore import EventStore
    from grandrounds.store.projection import open_projection, rebuild
    from tests.llm_helpers import HashEmbedder

    written: list[int] = []
    real = embedded.save_checkpoint
    monkeypatch.setattr(embedded, "save_checkpoint",
                        lambda store, run_id, proj: (written.append(proj.state.cases_completed), real(store, run_id, proj)))
    cases = [Case(case_id=f"c{i}", kind="mcq", question=f"Which organ {i % 5} case {i}?",
                  options={"A": "yes", "B": "no"}, answer="A") for i in range(40)]
    spec = RunSpec(policy=load_policy("evo-medagent"))
    with EventStore(tmp_path / "r.duckdb") as store:
        cache = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        ctx, _ = open_run(store, "r", spec, cache)
        asyncio.run(embedded.EmbeddedRunner(ctx, checkpoint_every=2).run(cases[:32]))
        assert written == [2, 4, 8, 16, 32]  # every 2 cases it was 16 writes, the last one twice
        ctx, _ = open_run(store, "r", spec, cache)  # resumed: doubling counts from where it starts
        asyncio.run(embedded.EmbeddedRunner(ctx, checkpoint_every=2).run(cases))
        assert written[5:] == [40]
        opened = open_projection(store, "r", cache)
        assert opened.how == "checkpoint" and opened.projection.state == rebuild(store, "r", cache).state


def test_a_policy_that_never_retrieves_keeps_no_content_keys(tmp_path):
    from grandrounds.app import run_cases
    from grandrounds.handlers.cases import Case
    from grandrounds.handlers.policies.config import load_policy
    from grandrounds.handlers.runs import RunSpec
    from grandrounds.store.embeddings import EmbeddingCache
    from grandrounds.store.eventstore import EventStore
    from grandrounds.store.projection import open_projection, rebuild
    import grandrounds.streams.embedded as embedded
    from tests.llm_helpers import HashEmbedder

    cases = [Case(case_id=f"c{i}", kind="mcq", question=f"Which organ {i % 5} case {i}?",
                  options={"A": "yes", "B": "no"}, answer="A") for i in range(12)]
    held: dict = {}
    original = embedded.EmbeddedRunner.run

    async def run(self, cases, on_case=None):  # the live projection, as the run leaves it
        held["proj"] = self.ctx.projection
        return await original(self, cases, on_case)

    with EventStore(tmp_path / "r.duckdb") as store:
        cache = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        embedded.EmbeddedRunner.run = run
        try:
            for policy in ("none", "evo-medagent"):
                run_cases(store, cases, RunSpec(policy=load_policy(policy)), run_id=policy, cache=cache)
                live, rebuilt = held["proj"], rebuild(store, policy, cache)
                opened = open_projection(store, policy, cache).projection
                for name, proj in (("live", live), ("rebuilt", rebuilt), ("opened", opened)):
                    if policy == "none":  # one key per case was kept for a guard nothing consults
                        assert proj.content_of == {} and proj.cases_by_content == {}
                    else:  # a policy that retrieves keeps its guard: every case, by content
                        assert len(proj.content_of) == 12 and proj.own_cases("c3") == {"c3"}
        finally:
            embedded.EmbeddedRunner.run = original


def test_key_ring_holds_keys_compactly_and_finds_every_one(tmp_path, monkeypatch):
    from grandrounds.store import keyring

    monkeypatch.setattr(keyring._KeyTable, "merge_at", 8)
    ring = keyring.KeyRing(tmp_path / "keys")
    refs = [ring.ref(f"case:c{i}") for i in range(100)]
    ring.ensure(refs[:50])
    ring.ensure(refs[50:] + ["odd ref kept verbatim"])
    keys = {r: ring.key(r) for r in refs}
    assert all(len(k) == 32 for k in keys.values()) and len(set(keys.values())) == 100
    # past `merge_at`, keys live in the sorted arrays, not in a dict entry per subject
    assert len(ring._keys._recent) < 8 and len(ring._keys._hi) >= 92 and len(ring._keys) == 101
    assert ring.key("odd ref kept verbatim") is not None and ring.key("0" * 32) is None
    assert ring.erase(refs[7]) and ring.key(refs[7]) is None and ring.is_erased(refs[7])
    fresh = keyring.KeyRing(tmp_path / "keys")  # what the file holds: the same keys, the erased one gone
    assert {r: fresh.key(r) for r in refs if r != refs[7]} == {r: k for r, k in keys.items() if r != refs[7]}
    assert fresh.key(refs[7]) is None and fresh.key("odd ref kept verbatim") == ring.key("odd ref kept verbatim")
    ring.ensure([refs[7]])  # the erased subject seen again: a new key
    assert ring.key(refs[7]) not in (None, keys[refs[7]])


def test_a_store_file_takes_duckdb_memory_bounds_from_the_environment(tmp_path, monkeypatch):
    import pytest

    from grandrounds.store.dbsettings import SETTINGS_ENV, DuckDBSettingError, duckdb_settings
    from grandrounds.store.eventstore import EventStore

    def limits(store) -> dict[str, str]:
        return dict(store.conn.execute("SELECT name, value FROM duckdb_settings() WHERE name IN "
                                       "('memory_limit', 'checkpoint_threshold')").fetchall())

    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    with EventStore(tmp_path / "a.duckdb") as store:
        default = limits(store)  # DuckDB's own unless asked
    monkeypatch.setenv(SETTINGS_ENV, "memory_limit=128MB, checkpoint_threshold=4MB")
    with EventStore(tmp_path / "a.duckdb") as store:  # a fresh DuckDB instance: the bounds given
        bounded = limits(store)
    assert bounded["memory_limit"] != default["memory_limit"] and bounded["memory_limit"].startswith("122")
    assert bounded["checkpoint_threshold"] != default["checkpoint_threshold"]
    with EventStore(":memory:") as mem:  # no file to evict blocks to: left alone
        assert limits(mem)["memory_limit"] == default["memory_limit"]
    assert duckdb_settings("off") == {} and duckdb_settings("") == {}
    assert duckdb_settings("memory_limit=1GB") == {"memory_limit": "1GB"}
    for bad in ("threads=4", "memory_limit=lots", "memory_limit"):
        with pytest.raises(DuckDBSettingError):
            duckdb_settings(bad)


def test_trim_cache_evicts_duckdbs_cached_blocks_and_restores_the_limit(tmp_path, monkeypatch):
    from grandrounds.store.dbsettings import SETTINGS_ENV
    from grandrounds.store.eventstore import EventStore

    def cached_mb(store) -> float:
        rows = store.conn.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall()
        return dict(rows).get("BASE_TABLE", 0) / 2 ** 20

    def limit(store) -> str:
        return store.conn.execute("SELECT value FROM duckdb_settings() WHERE name = 'memory_limit'").fetchone()[0]

    for env, db in ((None, "a.duckdb"), ("memory_limit=1GB", "b.duckdb")):
        if env is None:
            monkeypatch.delenv(SETTINGS_ENV, raising=False)
        else:
            monkeypatch.setenv(SETTINGS_ENV, env)
        with EventStore(tmp_path / db) as store:
            before = limit(store)
            # a scratch table (not the store's events) of ~40 MB, written to the file and read back
            store.conn.execute("CREATE TABLE scratch AS SELECT i, repeat(md5(i::VARCHAR), 8) AS p FROM range(250000) r(i)")
            store.conn.execute("CHECKPOINT")
            total = store.conn.execute("SELECT sum(length(p)) FROM scratch").fetchone()[0]
            assert cached_mb(store) > 30  # DuckDB keeps what it read, far below its limit
            store.trim_cache()
            assert cached_mb(store) <= 16 and limit(store) == before  # evicted; the limit as it was
            assert store.conn.execute("SELECT sum(length(p)) FROM scratch").fetchone()[0] == total


def _forty_cases_in_groups_of_4(store):
    """A `none` run of 40 small cases committed 4 at a time, in `store` (HashEmbedder: no model)."""
    from grandrounds.app import run_cases
    from grandrounds.handlers.cases import Case
    from grandrounds.handlers.policies.config import load_policy
    from grandrounds.handlers.runs import RunSpec
    from grandrounds.store.embeddings import EmbeddingCache
    from grandrounds.streams.embedded import GroupCommit
    from tests.llm_helpers import HashEmbedder

    cases = [Case(case_id=f"c{i}", kind="mcq", question=f"Which organ {i % 5} case {i}?",
                  options={"A": "yes", "B": "no"}, answer="A") for i in range(40)]
    cache = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
    return run_cases(store, cases, RunSpec(policy=load_policy("none")), run_id="r", cache=cache,
                     group=GroupCommit(cases=4, ms=1e9))


def test_runs_trim_duckdbs_cache_as_they_go(tmp_path, monkeypatch):
    from grandrounds.store import eventstore, recorder  # noqa: F401  (settings live on recorder)
    from grandrounds.store.eventstore import EventStore
    import grandrounds.streams.embedded as embedded

    monkeypatch.setattr(embedded, "TRIM_EVERY", 8)
    monkeypatch.setattr(recorder, "SCAN_PAGE", 4)
    monkeypatch.setattr(recorder, "TRIM_SCAN_PAGES", 2)
    trims: list[bool] = []  # whether each trim came from a whole-run read
    monkeypatch.setattr(EventStore, "trim_cache", lambda self: trims.append(self.trim_scans))
    with EventStore(tmp_path / "r.duckdb") as store:
        out = _forty_cases_in_groups_of_4(store)
        assert trims.count(False) == 40 // 8  # at a group commit, every 8 cases
        assert trims.count(True) >= 20  # the summary's reads of ~200 rows, every 2 pages of 4
        assert not store.trim_scans and out.summary["fingerprint"] == store.fingerprint("r")


def _wal_bytes(path) -> int:
    import os

    wal = f"{path}.wal"
    return os.path.getsize(wal) if os.path.exists(wal) else 0


def test_bounded_checkpoint_moves_the_wal_into_the_file_under_a_limit_and_restores_it(tmp_path, monkeypatch):
    from grandrounds.store import eventstore, recorder  # noqa: F401  (settings live on recorder)
    from grandrounds.store.dbsettings import SETTINGS_ENV
    from grandrounds.store.eventstore import EventStore
    from grandrounds.store.events import NewEvent
    from grandrounds.store import event_types as ev

    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    db = tmp_path / "c.duckdb"
    limits: list[str] = []
    with EventStore(db) as store:
        real = store._root.execute

        class Spy:  # records every SET memory_limit the store makes on its root connection
            def execute(self, sql, *a):
                if "memory_limit" in sql:
                    limits.append(sql)
                return real(sql, *a)

        store.append("r", [NewEvent(ev.CaseCompleted(index=i, correct=True)) for i in range(200)], -1)
        fp = store.fingerprint("r")
        before = store.conn.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        assert _wal_bytes(db) > 0
        assert store.checkpoint_if_due() is False and _wal_bytes(db) > 0  # far below CHECKPOINT_AT
        monkeypatch.setattr(recorder, "CHECKPOINT_AT", 1)
        store._root = Spy()
        assert store.checkpoint_if_due() is True
        store._root = real.__self__
        assert _wal_bytes(db) == 0  # in the file now
        assert limits[0] == f"SET memory_limit = '{recorder.CHECKPOINT_MEMORY}'" and "RESET" in limits[-1]
        assert store.conn.execute("SELECT current_setting('memory_limit')").fetchone()[0] == before
        assert store.fingerprint("r") == fp and store.verify_chain("r") is None


def test_no_bounded_checkpoint_while_a_large_value_is_pending(tmp_path, monkeypatch):
    from grandrounds.store import eventstore, recorder  # noqa: F401  (settings live on recorder)
    from grandrounds.store.dbsettings import SETTINGS_ENV
    from grandrounds.store.eventstore import EventStore
    from grandrounds.store.events import NewEvent
    from grandrounds.store import event_types as ev

    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    db = tmp_path / "c.duckdb"
    with EventStore(db) as store:
        store.append("r", [NewEvent(ev.CaseCompleted(index=0, correct=True))], -1)
        before = store.conn.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        # a memory checkpoint blob above LARGE_VALUE is pending: a checkpoint must pin it whole, and one
        # that cannot is fatal to the database, so DuckDB's own checkpoint (at its usual limit) takes it
        store.note_written(recorder.LARGE_VALUE + 1)
        limits: list[str] = []
        real = store._root.execute

        class Spy:
            def execute(self, sql, *a):
                limits.append(sql)
                return real(sql, *a)

        store._root = Spy()
        assert store.checkpoint_bounded() is False and _wal_bytes(db) == 0  # checkpointed, but not bounded
        store._root = real.__self__
        assert limits == ["CHECKPOINT"]  # at the usual limit, as DuckDB's own would be
        assert store.conn.execute("SELECT current_setting('memory_limit')").fetchone()[0] == before
        store.append("r", [NewEvent(ev.CaseCompleted(index=1, correct=True))], 0)  # small values only
        store.append("r", [NewEvent(ev.CaseCompleted(index=2, correct=True))], 1)
        assert store.checkpoint_bounded() is True  # and the next one is bounded again
        assert [e.seq for e in store.read("r")] == [0, 1, 2]


def test_a_run_takes_duckdbs_checkpoints_itself(tmp_path, monkeypatch):
    from grandrounds.store import eventstore, recorder  # noqa: F401  (settings live on recorder)
    from grandrounds.store.eventstore import EventStore

    monkeypatch.setattr(recorder, "CHECKPOINT_AT", 20_000)  # a few groups' worth of WAL
    ran: list[bool] = []
    real = EventStore.checkpoint_bounded
    monkeypatch.setattr(EventStore, "checkpoint_bounded", lambda self: ran.append(real(self)) or ran[-1])
    with EventStore(tmp_path / "r.duckdb") as store:
        out = _forty_cases_in_groups_of_4(store)
        assert len(ran) >= 3 and all(ran)  # at group commits as the WAL passed the mark, and at the end
        assert _wal_bytes(tmp_path / "r.duckdb") == 0
        assert out.summary["fingerprint"] == store.fingerprint("r")


def test_a_wal_left_by_another_process_is_checkpointed_at_the_usual_limit(tmp_path, monkeypatch):
    """What a WAL from a crashed process holds is unknown (a large value, maybe): the first checkpoint of
    the process that reopens the file is not bounded, since a bounded one that cannot pin a value is fatal."""
    import shutil

    from grandrounds.store.dbsettings import SETTINGS_ENV
    from grandrounds.store.eventstore import EventStore
    from grandrounds.store.events import NewEvent
    from grandrounds.store import event_types as ev

    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    live = tmp_path / "live.duckdb"
    store = EventStore(live)
    store.conn.execute("SET checkpoint_threshold = '1TB'")
    store.append("r", [NewEvent(ev.CaseCompleted(index=i, correct=True)) for i in range(50)], -1)
    crashed = tmp_path / "crashed.duckdb"
    shutil.copyfile(live, crashed)  # the files as a SIGKILL leaves them: rows committed to the WAL only
    shutil.copyfile(f"{live}.wal", f"{crashed}.wal")
    assert _wal_bytes(crashed) > 0
    store.close()
    with EventStore(crashed) as reopened:
        if _wal_bytes(crashed):  # DuckDB 2.0 replays it at open and keeps it: the first checkpoint is ours
            assert reopened.checkpoint_bounded() is False and _wal_bytes(crashed) == 0
        reopened.append("r", [NewEvent(ev.CaseCompleted(index=50, correct=True))], 49)
        assert reopened.checkpoint_bounded() is True  # from then on it knows what the WAL holds
        assert len(reopened.read("r")) == 51


def test_whole_run_reads_page_under_a_bound_and_read_a_page_too_big_for_it_again(tmp_path, monkeypatch):
    import duckdb

    from grandrounds.store import eventstore, recorder  # noqa: F401  (settings live on recorder)
    from grandrounds.store.dbsettings import SETTINGS_ENV
    from grandrounds.store.eventstore import EventStore
    from grandrounds.store.events import NewEvent
    from grandrounds.store.llm_events import CaseFailed

    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    monkeypatch.setattr(recorder, "SCAN_PAGE", 8)
    with EventStore(tmp_path / "s.duckdb", codec=None) as store:
        big = "x" * 400_000  # 8 of these in one page's top-N: more than the bound set below
        store.append("r", [NewEvent(CaseFailed(stage="act", reason=f"{i} {big}"), case_id=f"c{i}")
                           for i in range(24)], -1)
        store.conn.execute("CHECKPOINT")
        fp = store.fingerprint("r")
        before = store.conn.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        attempts: list[str] = []

        class Cursor:  # what each page query ran under, and whether it failed for memory
            def __init__(self, cur):
                self.cur = cur

            def execute(self, query, args=()):
                limit = store._root.execute("SELECT current_setting('memory_limit')").fetchone()[0]
                try:
                    out = self.cur.execute(query, args)
                    attempts.append(f"ok at {limit}")
                    return out
                except duckdb.OutOfMemoryException:
                    attempts.append(f"oom at {limit}")
                    raise

            def __getattr__(self, name):
                return getattr(self.cur, name)

        real_scan = EventStore._scan_page
        monkeypatch.setattr(EventStore, "_scan_page", lambda self, cur, q, a: real_scan(self, Cursor(cur), q, a))
        store.trim_scans = True
        monkeypatch.setattr(recorder, "TRIM_TO", "2MB")
        assert store.fingerprint("r") == fp  # the same rows, whether read bounded or again
        assert any(a.startswith("oom at") for a in attempts), attempts  # a page too big for 2 MB ...
        assert any(a.startswith("ok at") and "2.0 MiB" not in a for a in attempts), attempts  # ... read again
        monkeypatch.setattr(recorder, "TRIM_TO", "64MB")
        attempts.clear()
        assert store.fingerprint("r") == fp
        assert attempts and all(a == "ok at 61.0 MiB" for a in attempts), attempts  # every page bounded
        assert store.conn.execute("SELECT current_setting('memory_limit')").fetchone()[0] == before
