"""The memory projection: state fold + HNSW indexes, kept live, checkpointed, rebuildable.

The live path applies each stage's events as they are appended; `rebuild` folds the whole
log. Both go through `apply`, so they cannot drift apart. A checkpoint is the projection in
the safe checkpoint format (`store.safe_codec`: JSON and raw numeric arrays, never a pickle, so a
blob planted in the file cannot run code) together with the seq and chain hash it reflects: on
open, a checkpoint whose hash no longer matches the log at that seq, that was written by another
projection version, or that does not decode to a projection at that very seq and hash, is
dropped and the projection rebuilt; one that is merely behind is caught up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grandrounds.store import event_types as ev
from grandrounds.store.case_content import content_key
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.eventstore import EventStore
from grandrounds.store.events import EventPayload, StoredEvent, payload_class, upcast
from grandrounds.store.memory_state import MemoryState
from grandrounds.store.policy_memory import import_part, part_for, retrieves
from grandrounds.store.safe_codec import CheckpointFormatError, decode, encode

PROJECTION_VERSION = 6  # 6: exact (int8) vectors in the indexes, recorded vector keys; 2: policy memory parts, memory.seeded; 3: safe checkpoint format (pickles refused);
# 4: Evo-MedAgent's memory is a part too (its rules, episodes and indexes moved out of the projection)
# 5: content keys of the cases seen (the leakage guard by content)
CHECKPOINT_NAME = "memory"

CHECKPOINT_SCHEMA = """CREATE TABLE IF NOT EXISTS checkpoints (
    run_id VARCHAR NOT NULL, name VARCHAR NOT NULL, seq BIGINT NOT NULL, chain VARCHAR NOT NULL,
    version INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (run_id, name))"""


class MemoryProjection:
    _checkpoint_skip = ("_cache",)  # the embedding cache is bound after loading, never saved
    notes_content = True
    """Whether the content keys of cases are kept (`content_of`): only the leakage guard reads them,
    and only policies that retrieve consult it. A policy that never retrieves (`none`) keeps none:
    they were ~0.2 KB a case that never left memory (README, flat memory). Set at `run.started`;
    a class default, so checkpoints written before it was an attribute decode as they did."""

    def __init__(self, dim: int, exact_limit: int = 4096):
        self.dim = dim
        self.exact_limit = exact_limit
        self.state = MemoryState()
        self.last_chain: str | None = None
        self.content_of: dict[str, str] = {}
        """case id -> its content key (store/case_content.py), for every case this memory has seen."""
        self.cases_by_content: dict[str, list[str]] = {}
        """content key -> the cases that carried it, in the order seen."""
        self._cache: EmbeddingCache | None = None  # not saved in checkpoints
        self.vector_keys: dict[str, int] = {}
        """embedding key -> seq of the `embeddings.recorded` event that recorded it in this run: what a
        stage that used the vector need not record again."""

    def bind(self, cache: EmbeddingCache) -> "MemoryProjection":
        self._cache = cache
        return self

    @property
    def cache(self) -> EmbeddingCache | None:
        return self._cache

    @property
    def seq(self) -> int:
        return self.state.last_seq

    def own_cases(self, case_id: str) -> frozenset[str]:
        """The case and every case of the same content this memory has seen (renamed, options shuffled,
        or a training case a frozen split repeats): the leakage guard skips memory derived from any."""
        key = self.content_of.get(case_id)
        return frozenset((case_id, *self.cases_by_content.get(key, ()))) if key else frozenset((case_id,))

    def _note_content(self, case_id: str, key: str | None) -> None:
        if key is None or not self.notes_content or case_id in self.content_of:
            return
        self.content_of[case_id] = key
        self.cases_by_content.setdefault(key, []).append(case_id)

    def embed(self, text: str) -> np.ndarray:
        """The text's exact vector (recorded, else computed and quantized: store/vectors.py)."""
        assert self._cache is not None, "projection not bound to an embedding cache"
        return self._cache.exact(text)

    def apply_stored(self, events: list[StoredEvent]) -> None:
        for e in events:
            self.apply(e.seq, e.decode())
            self.last_chain = e.chain

    def apply(self, seq: int, payload: EventPayload) -> None:
        if isinstance(payload, ev.EmbeddingsRecorded):
            for v in payload.vectors:
                self.vector_keys.setdefault(v.key, seq)
            if self._cache is not None:
                self._cache.adopt(payload)
            self.state.last_seq = seq
            return
        if isinstance(payload, ev.MemorySeeded):
            self._seed(seq, payload)
            return
        if isinstance(payload, ev.CaseReceived) and self.notes_content:
            self._note_content(payload.case.get("case_id", ""), content_key(payload.case))
        if isinstance(payload, ev.RunStarted):
            self.state.policy_memory = part_for(payload.policy_name, self.dim, self.exact_limit)
            self.notes_content = retrieves(payload.policy_name)
        self.state.apply(seq, payload)
        if self.state.policy_memory is not None:
            self.state.policy_memory.apply(seq, payload, self.embed)

    def _seed(self, seq: int, seeded: ev.MemorySeeded) -> None:
        """Fold another run's memory events. They get negative seqs in the source's order, so
        everything tie-broken by creation order ranks them before this run's own items."""
        base = seeded.source_seq + 1
        if self._cache is not None:  # the source's vectors first: its stages recorded them after using them
            for item in seeded.events:
                if item["type"] == ev.EmbeddingsRecorded.event_type:
                    self._cache.adopt(ev.EmbeddingsRecorded.model_validate(
                        upcast(item["type"], item["schema_version"], item["payload"])))
        for item in seeded.events:
            data = upcast(item["type"], item["schema_version"], item["payload"])
            self.apply(item["seq"] - base, payload_class(item["type"]).model_validate(data))
        for case_id, key in seeded.source_cases.items():  # the source's cases, for the guard by content
            self._note_content(case_id, key)
        self.state.last_seq = seq


@dataclass(frozen=True)
class OpenedProjection:
    projection: MemoryProjection
    how: str  # "checkpoint", "checkpoint+catch-up", "rebuild: <reason>", "new"


def rebuild(store: EventStore, run_id: str, cache: EmbeddingCache, upto_seq: int | None = None,
            exact_limit: int = 4096) -> MemoryProjection:
    proj = MemoryProjection(cache.embedder.dim, exact_limit=exact_limit).bind(cache)
    cache.adopt_run(store, run_id)
    for e in store.iter(run_id, upto_seq=upto_seq):
        proj.apply(e.seq, e.decode())
        proj.last_chain = e.chain
    return proj


@dataclass(frozen=True)
class Checkpoint:
    """A projection frozen at `seq` (whose chain hash is `chain`), ready to be written."""

    seq: int
    chain: str
    blob: bytes


def checkpoint_of(proj: MemoryProjection) -> Checkpoint | None:
    """Snapshot the projection now (`safe_codec.encode`); None before its first event. Writing it
    is the slow part (`write_checkpoint`), and can happen later, on another thread, while the
    projection moves on."""
    if proj.seq < 0 or proj.last_chain is None:
        return None
    return Checkpoint(proj.seq, proj.last_chain, encode(proj))


def write_checkpoint(store: EventStore, run_id: str, checkpoint: Checkpoint | None) -> None:
    if checkpoint is None:
        return
    store.conn.execute(CHECKPOINT_SCHEMA)
    store.conn.execute(
        "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)",
        [run_id, CHECKPOINT_NAME, checkpoint.seq, checkpoint.chain, PROJECTION_VERSION, checkpoint.blob],
    )
    store.note_written(len(checkpoint.blob))


def save_checkpoint(store: EventStore, run_id: str, proj: MemoryProjection) -> None:
    write_checkpoint(store, run_id, checkpoint_of(proj))


def open_projection(store: EventStore, run_id: str, cache: EmbeddingCache,
                    exact_limit: int = 4096) -> OpenedProjection:
    """The run's projection at the head of its log: from a checkpoint when it is valid."""
    head_seq, _ = store.head(run_id)
    if head_seq < 0:
        return OpenedProjection(MemoryProjection(cache.embedder.dim, exact_limit).bind(cache), "new")
    store.conn.execute(CHECKPOINT_SCHEMA)
    row = store.conn.execute(
        "SELECT seq, chain, version, data FROM checkpoints WHERE run_id = ? AND name = ?",
        [run_id, CHECKPOINT_NAME],
    ).fetchone()
    reason = "no checkpoint"
    if row is not None:
        seq, chain, version, data = int(row[0]), row[1], int(row[2]), row[3]
        at = store.conn.execute("SELECT chain FROM events WHERE run_id = ? AND seq = ?", [run_id, seq]).fetchone()
        if version != PROJECTION_VERSION:
            reason = f"checkpoint written by projection v{version}, this is v{PROJECTION_VERSION}"
        elif at is None or at[0] != chain:
            reason = f"checkpoint at seq {seq} does not match the log"
        else:
            loaded = _load(store, run_id, bytes(data), seq, chain)
            if isinstance(loaded, str):
                reason = loaded
            else:
                loaded.bind(cache)
                cache.adopt_run(store, run_id)  # the run's own vectors, for what it folds and executes next
                if seq == head_seq:
                    return OpenedProjection(loaded, "checkpoint")
                loaded.apply_stored(store.read(run_id, after_seq=seq))
                return OpenedProjection(loaded, "checkpoint+catch-up")
    return OpenedProjection(rebuild(store, run_id, cache, exact_limit=exact_limit), f"rebuild: {reason}")


def _load(store: EventStore, run_id: str, data: bytes, seq: int, chain: str) -> MemoryProjection | str:
    """The checkpointed projection, or why it cannot be used (then the caller rebuilds).

    The blob is decoded by `safe_codec` (no code in it can run) and must be a projection that
    itself says it reflects `seq` with chain value `chain`, the ones checked against the log."""
    started = store.read(run_id, upto_seq=0)
    if started and started[0].type == ev.RunStarted.event_type:
        import_part(started[0].payload.get("policy_name"))  # its classes, named by the log, not by the blob
    try:
        proj = decode(data)
    except (CheckpointFormatError, ValueError, TypeError, RecursionError) as exc:
        return f"checkpoint at seq {seq} is not a safe checkpoint ({exc})"
    if not isinstance(proj, MemoryProjection) or not isinstance(getattr(proj, "state", None), MemoryState):
        return f"checkpoint at seq {seq} does not hold a memory projection"
    if proj.seq != seq or proj.last_chain != chain:
        return f"checkpoint at seq {seq} holds a projection of another point of the log"
    proj._cache = None
    return proj


def copy_projection(proj: MemoryProjection) -> MemoryProjection:
    """An independent copy of the projection (the checkpoint round trip, so exactly what a
    checkpoint would restore), bound to the same embedding cache. `--lag` pins cases to copies."""
    cache = proj._cache
    copied = decode(encode(proj))
    copied._cache = None
    return copied.bind(cache) if cache is not None else copied


def projections_at(store: EventStore, run_id: str, cache: EmbeddingCache, seqs: list[int],
                   exact_limit: int = 4096) -> dict[int, MemoryProjection]:
    """The run's projection as of each seq in `seqs` (after the event at that seq), in one fold of the
    log: how a resumed `--lag` run gets back the memory versions its next cases are pinned to."""
    wanted = sorted(set(seqs))
    out: dict[int, MemoryProjection] = {}
    if not wanted:
        return out
    proj = MemoryProjection(cache.embedder.dim, exact_limit=exact_limit).bind(cache)
    cache.adopt_run(store, run_id)
    pending = list(wanted)
    for e in store.iter(run_id, upto_seq=wanted[-1]):
        while pending and pending[0] < e.seq:  # the projection before this event
            out[pending.pop(0)] = copy_projection(proj)
        proj.apply(e.seq, e.decode())
        proj.last_chain = e.chain
        while pending and pending[0] == e.seq:
            out[pending.pop(0)] = copy_projection(proj)
    for seq in pending:  # past the log's head: nothing more to fold
        out[seq] = copy_projection(proj)
    return out
