"""Fewer passes of Python's cyclic garbage collector while a run executes.

A run allocates ~180 tracked objects a case (payload models, dumps, retrieval lists), most freed at
once by reference counting. With CPython's default thresholds (700, 10, 10) that still triggers a
young collection every ~4 cases, a middle one every ~40, and now and then a full one that rescans
everything start-up loaded (the embedding model, the libraries: a heap that never changes during a
run). Measured on a 500-case sim replay in one process (`bench_replay_rate.py`'s pass, GC callbacks'
CPU time): 0.15-0.2 s of collection a pass with the defaults (one full collection 0.07-0.12 s), about
0.05 s with the heap found at the start frozen (`gc.freeze`: left out of every collection) and the
young generation collected every 10,000 allocations; ~12 % of the pass.

Collection order has no say in any event byte (nothing in a payload depends on when an object is
freed); tests/test_collector.py runs the same cases with and without this and compares fingerprints.
Garbage cycles still get collected, only less often: at most ~10,000 young objects wait, and what was
frozen is handed back to the collector when the outermost run ends. The Kafka worker tunes the
collector for its whole life instead (streams/kafka_app.py, `tune_gc`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Iterator

YOUNG_THRESHOLD = 10_000
"""Allocations (net of frees) between two young collections while a run executes (CPython's default:
700). The older generations keep their own thresholds."""

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] | None = None


def _after_fork_in_child() -> None:
    """A forked child (replay workers fork on Linux) gets a fresh lock: one held by another thread at the
    fork would never be released there. The rest is kept: a run the parent was in the middle of does
    not run in the child, so a heap frozen then stays frozen, tuned, for the child's life (as the Kafka
    worker's is)."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def fewer_collections(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Freeze the heap found on entry and collect the young generation every `young` allocations, until
    the outermost such block ends; then the thresholds are restored and the frozen heap is unfrozen. A
    threshold already higher (a process tuned by its owner) is kept; with the collector disabled, or
    the heap already frozen by its owner (the Kafka worker), nothing is touched."""
    global _depth, _saved
    with _lock:
        owner_frozen = _depth == 0 and gc.get_freeze_count() > 0
        mine = _depth > 0 or (gc.isenabled() and not owner_frozen)
        if mine:
            if _depth == 0:
                _saved = gc.get_threshold()
                gc.freeze()
                if _saved[0] < young:
                    gc.set_threshold(young, _saved[1], _saved[2])
            _depth += 1
    try:
        yield
    finally:
        if mine:
            with _lock:
                _depth -= 1
                if _depth == 0 and _saved is not None:
                    gc.set_threshold(*_saved)
                    gc.unfreeze()
                    _saved = None
