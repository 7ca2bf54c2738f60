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

The same folder holds the field de-identifier's results (`MachineSpanCache`, its own SQLite file): a
text's identifier spans as JSON, keyed by the tool's version, its configuration digest and the text's
sha256 (handlers/field_deidentifier.py `text_key`), so a text is de-identified once a machine, by
whichever process or permutation meets it first; a warm run never loads the tool's filters.

Where: $GRANDROUNDS_EMBEDDING_CACHE (a folder), else ~/.cache/grandrounds/embeddings;
`GRANDROUNDS_EMBEDDING_CACHE=off` disables both. A folder that cannot be created or written
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


class _MachineFile:
    """One SQLite file of the cache folder; one connection per process, opened on first use. A file that
    cannot be opened leaves this cache off for the process (a warning on stderr)."""

    file_name = ""
    schema = ""
    what = "machine cache"

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / self.file_name
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
            conn.execute(self.schema)
        except (OSError, sqlite3.Error) as exc:
            print(f"grandrounds: {self.what} off ({self.path}: {exc})", file=sys.stderr)
            self._broken = True
            return None
        self._conn = conn
        return conn

    def _select(self, sql: str, key: str) -> tuple | None:
        with self._lock:
            conn = self._connect()
            if conn is None:
                return None
            try:
                return conn.execute(sql, (key,)).fetchone()
            except sqlite3.Error:
                return None

    def _insert(self, sql: str, data: list[tuple]) -> int:
        if not data:
            return 0
        with self._lock:
            conn = self._connect()
            if conn is None:
                return 0
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(sql, data)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                print(f"grandrounds: could not write the {self.what} ({exc})", file=sys.stderr)
                return 0
        self.writes += len(data)
        return len(data)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class MachineEmbeddingCache(_MachineFile):
    """Vectors by content key."""

    file_name = FILE_NAME
    schema = SCHEMA
    what = "machine embedding cache"

    def get(self, key: str, dim: int) -> np.ndarray | None:
        row = self._select("SELECT dim, vector FROM vectors WHERE key = ?", key)
        if row is None or row[0] != dim or len(row[1]) != 4 * dim:
            return None
        self.reads += 1
        return np.frombuffer(row[1], dtype="<f4").astype(np.float32, copy=True)

    def put_many(self, model: str, rows: Iterable[tuple[str, np.ndarray]]) -> int:
        data = [(k, model, int(v.shape[0]), np.asarray(v, dtype="<f4").tobytes()) for k, v in rows]
        return self._insert("INSERT OR IGNORE INTO vectors VALUES (?, ?, ?, ?)", data)


class MachineSpanCache(_MachineFile):
    """The field de-identifier's spans of a text, as JSON text by `text_key`. What a row holds is data:
    the reader (handlers/field_deidentifier.py) checks each span against the text before using it, and a
    row that fails is recomputed and replaced."""

    file_name = "deidentified.sqlite3"
    schema = "CREATE TABLE IF NOT EXISTS spans (key TEXT PRIMARY KEY, spans TEXT NOT NULL) WITHOUT ROWID"
    what = "machine de-identification cache"

    def get(self, key: str) -> str | None:
        row = self._select("SELECT spans FROM spans WHERE key = ?", key)
        if row is None or not isinstance(row[0], str):
            return None
        self.reads += 1
        return row[0]

    def put(self, key: str, spans: str) -> int:
        """REPLACE, not IGNORE: the only row a put meets is one the reader rejected (a result is a pure
        function of its key, so a valid row already holds these very bytes)."""
        return self._insert("INSERT OR REPLACE INTO spans VALUES (?, ?)", [(key, spans)])


_SHARED: dict[tuple[type, Path], _MachineFile] = {}
_SHARED_LOCK = threading.Lock()


def _shared(kind: type[_MachineFile]) -> _MachineFile | None:
    folder = default_dir()
    if folder is None:
        return None
    with _SHARED_LOCK:
        cache = _SHARED.get((kind, folder))
        if cache is None:
            cache = _SHARED[(kind, folder)] = kind(folder)
        return cache


def machine_cache() -> MachineEmbeddingCache | None:
    """This process's handle on the machine cache the environment names (None when it is off)."""
    return _shared(MachineEmbeddingCache)  # type: ignore[return-value]


def span_cache() -> MachineSpanCache | None:
    """This process's handle on the machine's de-identification cache (None when the folder is off)."""
    return _shared(MachineSpanCache)  # type: ignore[return-value]
