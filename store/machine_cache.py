"""One embedding cache per machine, shared by every database file and process.

Vectors are content-addressed (the key is sha256(model + text), as in `EmbeddingCache`) and
stored as the raw little-endian float32 bytes the model produced, so a vector read back is
the same bits that were written, whichever run, file or process embedded it first. That is
what lets a new `--db` start without loading the model when the machine has seen its texts.

The store is a SQLite file in WAL mode: any number of processes read while one writes, and
SQLite's file locks serialise writers (a writer waits on `busy_timeout`, never corrupts).
Rows are only ever inserted (INSERT OR IGNORE: two processes embedding the same text write
the same bytes, the second write is a no-op), in one transaction per flush. Nothing read
from the file is executed or unpickled: a row is bytes of the expected length or it is
ignored.

Where: $GRANDROUNDS_EMBEDDING_CACHE (a folder), else ~/.cache/grandrounds/embeddings;
`GRANDROUNDS_EMBEDDING_CACHE=off` disables it. A folder that cannot be created or written
leaves the cache off for the process (a warning on stderr): it is an accelerator, never
a reason to fail a run.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Iterable

import numpy as np

ENV = "GRANDROUNDS_EMBEDDING_CACHE"
FILE_NAME = "vectors.sqlite3"

SCHEMA = """CREATE TABLE IF NOT EXISTS vectors (
    key TEXT PRIMARY KEY, model TEXT NOT NULL, dim INTEGER NOT NULL, vector BLOB NOT NULL) WITHOUT ROWID"""


def default_dir() -> Path | None:
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "none", "0") else Path(value).expanduser()
    return Path.home() / ".cache" / "grandrounds" / "embeddings"


class MachineEmbeddingCache:
    """Vectors by content key in a SQLite file; one connection per process, opened on first use."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / FILE_NAME
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._broken = False
        self.reads = 0
        self.writes = 0

    def _connect(self) -> sqlite3.Connection | None:
        if self._pid != os.getpid():  # a forked child: SQLite connections must not cross a fork
            self._conn, self._pid = None, os.getpid()
        if self._conn is not None or self._broken:
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash loses at most the last flush
            conn.execute(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            print(f"grandrounds: machine embedding cache off ({self.path}: {exc})", file=sys.stderr)
            self._broken = True
            return None
        self._conn = conn
        return conn

    def get(self, key: str, dim: int) -> np.ndarray | None:
        with self._lock:
            conn = self._connect()
            if conn is None:
                return None
            try:
                row = conn.execute("SELECT dim, vector FROM vectors WHERE key = ?", (key,)).fetchone()
            except sqlite3.Error:
                return None
        if row is None or row[0] != dim or len(row[1]) != 4 * dim:
            return None
        self.reads += 1
        return np.frombuffer(row[1], dtype="<f4").astype(np.float32, copy=True)

    def put_many(self, model: str, rows: Iterable[tuple[str, np.ndarray]]) -> int:
        data = [(k, model, int(v.shape[0]), np.asarray(v, dtype="<f4").tobytes()) for k, v in rows]
        if not data:
            return 0
        with self._lock:
            conn = self._connect()
            if conn is None:
                return 0
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT OR IGNORE INTO vectors VALUES (?, ?, ?, ?)", data)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                print(f"grandrounds: could not write the machine embedding cache ({exc})", file=sys.stderr)
                return 0
        self.writes += len(data)
        return len(data)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


_SHARED: dict[Path, MachineEmbeddingCache] = {}
_SHARED_LOCK = threading.Lock()


def machine_cache() -> MachineEmbeddingCache | None:
    """This process's handle on the machine cache the environment names (None when it is off)."""
    folder = default_dir()
    if folder is None:
        return None
    with _SHARED_LOCK:
        cache = _SHARED.get(folder)
        if cache is None:
            cache = _SHARED[folder] = MachineEmbeddingCache(folder)
        return cache
