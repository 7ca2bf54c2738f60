"""A deterministic cosine index over memory items: hnswlib above a size, exact below it.

Search results must be a pure function of the projection (DESIGN §3). So: items get
labels in insertion (event) order, the HNSW graph is built and extended single-threaded
with a fixed seed, candidates are always re-scored exactly against the stored vectors,
and ties are broken by label. Below `exact_limit` live items an exact matrix product is
both faster and exact, so the graph is only built once the store outgrows it.
"""

from __future__ import annotations

import contextlib

import hnswlib
import numpy as np


class VectorIndex:
    def __init__(self, dim: int, exact_limit: int = 4096, m: int = 16,
                 ef_construction: int = 100, ef_search: int = 128, seed: int = 100):
        self.dim = dim
        self.exact_limit = exact_limit
        self.m = m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self.seed = seed
        self._vecs = np.zeros((64, dim), dtype=np.float32)
        self._alive = np.zeros(64, dtype=bool)
        self._n = 0
        self._live = 0
        self._hnsw: hnswlib.Index | None = None

    def __len__(self) -> int:
        return self._live

    @property
    def uses_hnsw(self) -> bool:
        return self._hnsw is not None

    def add(self, vec: np.ndarray) -> int:
        """Add a unit vector; returns its label (the insertion ordinal)."""
        label = self._n
        if label >= len(self._vecs):
            grow = len(self._vecs) * 2
            self._vecs = np.resize(self._vecs, (grow, self.dim))
            self._vecs[label:] = 0
            alive = np.zeros(grow, dtype=bool)
            alive[: len(self._alive)] = self._alive
            self._alive = alive
        self._vecs[label] = vec
        self._alive[label] = True
        self._n += 1
        self._live += 1
        if self._hnsw is not None:
            if self._n > self._hnsw.get_max_elements():
                self._hnsw.resize_index(max(2 * self._hnsw.get_max_elements(), self._n))
            self._hnsw.add_items(vec.reshape(1, -1), [label], num_threads=1)
        elif self._live > self.exact_limit:
            self._build_hnsw()
        return label

    def remove(self, label: int) -> None:
        if not self._alive[label]:
            return
        self._alive[label] = False
        self._live -= 1
        if self._hnsw is not None:
            self._hnsw.mark_deleted(label)

    def vector(self, label: int) -> np.ndarray:
        return self._vecs[label]

    def _build_hnsw(self) -> None:
        index = hnswlib.Index(space="cosine", dim=self.dim)
        index.init_index(max_elements=max(2 * self._n, 1024), ef_construction=self.ef_construction,
                         M=self.m, random_seed=self.seed)
        index.set_num_threads(1)
        labels = np.arange(self._n)
        # Every label is inserted (dead ones too, then marked) so labels stay insertion ordinals.
        index.add_items(self._vecs[: self._n], labels, num_threads=1)
        for label in np.flatnonzero(~self._alive[: self._n]):
            index.mark_deleted(int(label))
        index.set_ef(self.ef_search)
        self._hnsw = index

    def _rescore(self, cand: np.ndarray, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        # Scores are recomputed in float64, row by row (elementwise product and a per-row sum,
        # no BLAS kernel whose blocking depends on the matrix size), so HNSW and exact search
        # give the same score to the same item bit for bit.
        sims = (self._vecs[cand].astype(np.float64) * query.astype(np.float64)).sum(axis=1)
        order = np.lexsort((cand, -sims))[:k]
        # tolist(): Python ints and floats in one C pass (the same values; indexing numpy scalars one by
        # one cost more than the rescoring itself)
        return list(zip(cand[order].tolist(), sims[order].tolist()))

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Top-k live items by cosine, as (label, cosine), best first, ties by label."""
        k = min(k, self._live)
        if k <= 0:
            return []
        if self._hnsw is not None:
            try:
                labels, _ = self._hnsw.knn_query(query.reshape(1, -1), k=k, num_threads=1)
                return self._rescore(labels[0].astype(np.int64), query, k)  # labels are distinct
            except RuntimeError:
                pass  # graph could not return k live items: fall back to exact
        sims = self._vecs[: self._n] @ query
        if self._live < self._n:  # (nothing to mask while no item was removed: a pass and a copy fewer)
            sims = np.where(self._alive[: self._n], sims, -np.inf)
        if k < self._live:
            # The k-th best score; for k = 1 that is the maximum, without a partition of every score.
            kth = sims.max() if k == 1 else sims[np.argpartition(-sims, k - 1)[:k]].min()
            # Widen to everything within float32 noise of the k-th score: the float64 rescoring
            # and the label tie-break then decide, exactly.
            part = np.flatnonzero(sims >= kth - 1e-5)
        else:
            part = np.flatnonzero(np.isfinite(sims))
        return self._rescore(part, query, k)

    def similarities(self, query: np.ndarray, labels: list[int]) -> np.ndarray:
        return self._vecs[labels] @ query if labels else np.zeros(0, dtype=np.float32)


@contextlib.contextmanager
def single_threaded_blas():
    """One BLAS thread while a run executes.

    A run is a sequential fold, and its vector searches are small matrix-vector products:
    OpenBLAS's thread hand-off costs ~10x the product itself (1.2 ms against 0.06 ms per
    2,500-row search measured here), and more again on a busy machine. Parallelism comes
    from running runs in separate processes instead. Results do not depend on it: every
    score that reaches an event is recomputed in float64 over the candidates
    (store.vector_index).
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: without it BLAS keeps its default threads
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield
