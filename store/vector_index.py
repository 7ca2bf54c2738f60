"""A deterministic cosine index over memory items: hnswlib above a size, exact below it.

Search results must be a pure function of the projection, on any CPU (DESIGN §3). The vectors are
integer-valued (store/vectors.py: int8 quantized embeddings), so every dot product, whether numpy's BLAS,
hnswlib's SIMD kernels or a loop computes it, is the same exact integer, and every cosine the same
correctly rounded float64. Items get labels in insertion (event) order, the HNSW graph is built and
extended single-threaded with a fixed seed over inner products (exact integers: the graph is the same on
every CPU), candidates are re-scored by exact cosine, and ties are broken by label. Below `exact_limit`
live items an exact matrix product is both faster and exact, so the graph is only built once the store
outgrows it.
"""

from __future__ import annotations

import contextlib

import hnswlib
import numpy as np

from grandrounds.store.vectors import cosines_from_dots, norm_sq


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
        self._norms = np.zeros(64, dtype=np.float64)
        """|v|² of each stored vector, exact (an integer): the cosine's denominator, computed once."""
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
        """Add an integer-valued vector (store/vectors.py `exact`); returns its label (the insertion ordinal)."""
        label = self._n
        if label >= len(self._vecs):
            grow = len(self._vecs) * 2
            self._vecs = np.resize(self._vecs, (grow, self.dim))
            self._vecs[label:] = 0
            self._norms = np.resize(self._norms, grow)
            self._norms[label:] = 0
            alive = np.zeros(grow, dtype=bool)
            alive[: len(self._alive)] = self._alive
            self._alive = alive
        self._vecs[label] = vec
        self._norms[label] = norm_sq(self._vecs[label])
        self._alive[label] = True
        self._n += 1
        self._live += 1
        if self._hnsw is not None:
            if self._n > self._hnsw.get_max_elements():
                self._hnsw.resize_index(max(2 * self._hnsw.get_max_elements(), self._n))
            self._hnsw.add_items(self._vecs[label].reshape(1, -1), [label], num_threads=1)
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
        # Inner product, not hnswlib's "cosine" space: "cosine" normalises each vector in float (its last
        # bits the compiler's and CPU's), inner products of integer vectors are exact integers. Quantized
        # unit vectors all have norms within a fraction of a percent of 128, so the nearest by inner
        # product are the nearest by cosine, which the exact re-scoring then orders.
        index = hnswlib.Index(space="ip", dim=self.dim)
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

    def _cosines(self, labels: np.ndarray, query: np.ndarray) -> np.ndarray:
        dots = self._vecs[labels] @ query  # exact: integers below 2^23 in float32, any summation order
        return cosines_from_dots(dots, self._norms[labels], norm_sq(query))

    def _rescore(self, cand: np.ndarray, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        sims = self._cosines(cand, query)
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
        n = self._n
        sims = cosines_from_dots(self._vecs[:n] @ query, self._norms[:n], norm_sq(query))
        if self._live < n:  # (nothing to mask while no item was removed: a pass and a copy fewer)
            sims = np.where(self._alive[:n], sims, -np.inf)
        if k < self._live:
            # The k-th best score (exact); for k = 1 that is the maximum, without a partition of every score.
            kth = sims.max() if k == 1 else sims[np.argpartition(-sims, k - 1)[:k]].min()
            part = np.flatnonzero(sims >= kth)  # every item tied with the k-th: the label tie-break decides
        else:
            part = np.flatnonzero(np.isfinite(sims))
        order = np.lexsort((part, -sims[part]))[:k]
        return list(zip(part[order].tolist(), sims[part][order].tolist()))

    def similarities(self, query: np.ndarray, labels: list[int]) -> np.ndarray:
        """Exact cosines of the query with the items `labels`."""
        if not labels:
            return np.zeros(0, dtype=np.float64)
        return self._cosines(np.asarray(labels, dtype=np.int64), query)


@contextlib.contextmanager
def single_threaded_blas():
    """One BLAS thread while a run executes.

    A run is a sequential fold, and its vector searches are small matrix-vector products:
    OpenBLAS's thread hand-off costs ~10x the product itself (1.2 ms against 0.06 ms per
    2,500-row search measured here), and more again on a busy machine. Parallelism comes
    from running runs in separate processes instead. Results do not depend on it: every
    dot product is of integer vectors, exact in any summation order (store.vectors).
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: without it BLAS keeps its default threads
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield
