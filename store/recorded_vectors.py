"""Recorded embeddings: the vectors a run used, read from its `embeddings.recorded` events.

A run's vectors are inputs from outside (the embedding model's floats depend on the CPU's kernels), so
they are recorded once, in the run's own log, and everything that re-executes or rebuilds the run uses
the recorded ones (DESIGN §3). This module is the codec of those events and the lookup built from them:
`RecordedVectors` maps an embedding-cache key to its int8 vector. `EmbeddingCache.exact` consults it
before anything else, so a log that carries all its vectors verifies without loading the model (or
torch) at all.

Which vectors a stage used is noted per stage (`noting_vectors`, a context variable: the `--lag` ahead
pass runs stages of several cases concurrently, and each must note only its own), and the stage's new
ones are emitted at its end (`handlers/pipeline.py`).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
from typing import Iterable, Iterator

import numpy as np

from grandrounds.store.errors import InvalidInput
from grandrounds.store.event_types import EmbeddingsRecorded, RecordedVector


class RecordedVectorError(InvalidInput, ValueError):
    """A recorded vector that is not one (wrong length, not base64): the log is damaged or forged."""


def encode_q(q: np.ndarray) -> str:
    return base64.b64encode(np.asarray(q, dtype=np.int8).tobytes()).decode("ascii")


def decode_q(s: str, dim: int) -> np.ndarray:
    try:
        raw = base64.b64decode(s.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise RecordedVectorError(f"a recorded vector is not base64: {exc}") from None
    if len(raw) != dim:
        raise RecordedVectorError(f"a recorded vector has {len(raw)} components, the embedder {dim}")
    return np.frombuffer(raw, dtype=np.int8).copy()


class RecordedVectors:
    """key -> int8 vector, from records (a run's log, or a source run a replay re-executes)."""

    def __init__(self, dim: int):
        self.dim = dim
        self._q: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._q)

    def __contains__(self, key: str) -> bool:
        return key in self._q

    def get(self, key: str) -> np.ndarray | None:
        raw = self._q.get(key)
        return None if raw is None else np.frombuffer(raw, dtype=np.int8)

    def save_table(self, conn, table: str) -> None:
        """Write every vector into `table` (a replay's seed file for its worker processes)."""
        conn.execute(f"CREATE TABLE {table} (key VARCHAR PRIMARY KEY, q BLOB NOT NULL)")
        if self._q:
            conn.execute(f"INSERT INTO {table} SELECT * FROM (SELECT unnest(?::VARCHAR[]), unnest(?::BLOB[]))",
                         [list(self._q), list(self._q.values())])

    def load_table(self, conn, table: str) -> None:
        """Read what `save_table` wrote (each checked for its length)."""
        for key, raw in conn.execute(f"SELECT key, q FROM {table}").fetchall():
            if len(raw) != self.dim:
                raise RecordedVectorError(f"{table}: a vector of {len(raw)} components, the embedder {self.dim}")
            self._q[key] = bytes(raw)

    def adopt(self, recorded: EmbeddingsRecorded, model: str) -> list[str]:
        """Take a recorded event's vectors (those of another embedder are not this cache's); returns the
        keys it did not hold before."""
        if recorded.model != model:
            return []
        new = []
        for v in recorded.vectors:
            # A key names its text, so a vector held already is this one: a rebuild adopts the whole log
            # first, then folds the same events again; decode each once.
            if v.key not in self._q:
                self._q[v.key] = decode_q(v.q, self.dim).tobytes()
                new.append(v.key)
        return new


def recorded_event(model: str, vectors: Iterable[tuple[str, np.ndarray]]) -> EmbeddingsRecorded:
    return EmbeddingsRecorded(model=model, vectors=[RecordedVector(key=k, q=encode_q(q)) for k, q in vectors])


_STAGE: contextvars.ContextVar[dict[str, np.ndarray] | None] = contextvars.ContextVar("grandrounds_stage_vectors",
                                                                                       default=None)


@contextlib.contextmanager
def noting_vectors() -> Iterator[dict[str, np.ndarray]]:
    """Collect, in first-use order, the (key, int8 vector) of every text embedded inside the block."""
    used: dict[str, np.ndarray] = {}
    token = _STAGE.set(used)
    try:
        yield used
    finally:
        _STAGE.reset(token)


def note_vector(key: str, q: np.ndarray) -> None:
    used = _STAGE.get()
    if used is not None and key not in used:
        used[key] = q
