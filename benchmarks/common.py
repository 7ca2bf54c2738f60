"""What the benchmark scripts share: bulk-loading a synthetic memory and summarising timings."""

from __future__ import annotations

import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from handlers.runs import RunSpec
from store.embeddings import EmbeddingCache, shared_minilm
from store.events import NewEvent
from store.eventstore import EventStore

VOCAB = ("fever cough dyspnea chest pain syncope rash headache vomiting confusion tachycardia hypotension "
         "wheeze edema jaundice hematuria seizure weakness numbness pallor cyanosis murmur effusion "
         "consolidation nodule cavitation infiltrate pneumothorax cardiomegaly atelectasis").split()
"""Findings the synthetic memories are written from."""


def synthetic_words(rng: np.random.Generator, k: int = 6) -> list[str]:
    """k distinct findings: the trigger words of one synthetic memory item."""
    return [VOCAB[j] for j in rng.choice(len(VOCAB), k, replace=False)]


def unit_vector(rng: np.random.Generator, dim: int = 384) -> np.ndarray:
    """A random float32 direction: a synthetic item's embedding (the items need not mean anything)."""
    vec = rng.standard_normal(dim).astype(np.float32)
    return vec / np.linalg.norm(vec)


def bench_store(prefix: str) -> tuple[EventStore, EmbeddingCache]:
    """A fresh DuckDB file in a temp folder and an embedding cache on it."""
    store = EventStore(Path(tempfile.mkdtemp(prefix=prefix)) / "bench.duckdb")
    return store, EmbeddingCache(shared_minilm(), store.conn)


def seed_run(store: EventStore, run_id: str, spec: RunSpec, cache: EmbeddingCache, events: list[NewEvent]) -> float:
    """Start `run_id` and bulk-append `events` after its `run.started`; returns events/s appended."""
    store.append(run_id, [NewEvent(spec.started_event(cache.embedder.name))], -1)
    t = time.perf_counter()
    seq = 0
    for i in range(0, len(events), 1000):  # stage-sized batches would be smaller; this is bulk load
        batch = events[i:i + 1000]
        store.append(run_id, batch, seq)
        seq += len(batch)
    return len(events) / max(time.perf_counter() - t, 1e-9)


def ms_summary(seconds: list[float]) -> dict:
    """p50 / p90 / mean in milliseconds."""
    ms = sorted(x * 1000 for x in seconds)
    return {"p50": round(statistics.median(ms), 3), "p90": round(ms[int(0.9 * len(ms))], 3),
            "mean": round(statistics.fmean(ms), 3)}


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
