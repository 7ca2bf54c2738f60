"""After BULK_AFTER point lookups the embedding cache reads the file's vectors ahead in one pass
(bounded by memory_limit), and what it reads is the same vectors bit for bit."""

from __future__ import annotations

import numpy as np

from grandrounds.store.embeddings import BULK_AFTER, EmbeddingCache
from grandrounds.store.eventstore import EventStore
from tests.llm_helpers import HashEmbedder


def test_the_file_is_read_ahead_after_some_point_lookups_and_gives_the_same_vectors(tmp_path):
    texts = [f"finding {i} of case {i * 7}" for i in range(3 * BULK_AFTER)]
    with EventStore(tmp_path / "e.duckdb") as store:
        writer = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        first = {t: writer.get(t).copy() for t in texts}
        writer.flush()
        fresh = EmbeddingCache(HashEmbedder(), store.conn, machine=None)  # a new process on the same file
        head = [fresh.get(t) for t in texts[:BULK_AFTER]]
        # The rest must now come from memory: take them out of the file and check none is re-embedded.
        store.conn.execute("DELETE FROM embedding_cache")
        rest = [fresh.get(t) for t in texts[BULK_AFTER:]]
        assert fresh.misses == 0
        assert all(np.array_equal(v, first[t]) and v.dtype == np.float32 for v, t in zip(head + rest, texts))


def test_read_ahead_respects_the_memory_limit(tmp_path):
    texts = [f"text {i}" for i in range(2 * BULK_AFTER)]
    with EventStore(tmp_path / "e.duckdb") as store:
        writer = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        for t in texts:
            writer.get(t)
        writer.flush()
        fresh = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        fresh.memory_limit = 4
        assert all(fresh.get(t) is not None for t in texts) and fresh.misses == 0
        assert len(fresh._mem) <= 4


class _NamedLikeMiniLM(HashEmbedder):
    name = "all-MiniLM-L6-v2"  # with this name, `key = ? AND model = ?` is planned as a scan of the whole table


def test_a_point_lookup_is_answered_from_the_primary_key_index(tmp_path):
    """A lookup past the in-memory vectors must not scan the table: that cost grew with every text the
    file holds (2.4 ms a lookup at 5,000 vectors), and came back each case once memory outgrew the
    in-memory cache. The plan DuckDB makes for the cache's own statement, on a file as runs leave it."""
    with EventStore(tmp_path / "e.duckdb") as store:
        cache = EmbeddingCache(_NamedLikeMiniLM(), store.conn, machine=None)
        for i in range(100):
            cache.get(f"case text {i}")
        cache.flush()
    with EventStore(tmp_path / "e.duckdb") as store:
        key = EmbeddingCache(_NamedLikeMiniLM(), store.conn, machine=None).key("case text 7")
        plan = store.conn.execute("EXPLAIN ANALYZE " + EmbeddingCache.LOOKUP, [key]).fetchall()[0][1]
        assert "Index Scan" in plan and "Sequential Scan" not in plan, plan


def test_a_vector_stored_under_another_model_is_not_used(tmp_path):
    with EventStore(tmp_path / "e.duckdb") as store:
        cache = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        key = cache.key("a finding")
        store.conn.execute("INSERT INTO embedding_cache VALUES (?, 'another-model', ?)", [key, [1.0] * 64])
        vec = cache.get("a finding")
        assert cache.misses == 1 and np.array_equal(vec, HashEmbedder().embed_one("a finding"))
