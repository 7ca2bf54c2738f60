"""Exact vector arithmetic: the scores that decide are the same bits on every CPU (DESIGN §3).

A MiniLM vector's last bits depend on torch's CPU kernels (AVX-512, AVX2, baseline), and a float dot
product's last bits on the summation order of the BLAS or SIMD code computing it. So a vector enters a
run quantized: each component of the unit vector becomes round(128·x) clipped to ±127, an int8. Every
vector the memory holds is that integer vector (as float32, whose integers are exact up to 2^24).

Why this is exact. A dot product of two such 384-dim vectors is an integer of magnitude at most
|a|·|b| (Cauchy–Schwarz) ≤ 384·127² < 2^23, and so is every partial sum in any order: float32 holds each
exactly, so numpy's BLAS, hnswlib's SIMD kernels and a plain loop all return the same integer. A
cosine is then dot / sqrt(|a|²·|b|²): the product of two squared norms is an integer below 2^46
(exact in float64), and IEEE 754 requires sqrt and division to be correctly rounded, so the cosine is
the same float64 everywhere. Ties are broken by labels (insertion order), never by memory addresses.

Why 128 and not 127: 128 is a power of two, so x·128 is exact in float32 and the quantization itself
is correctly rounded (round half to even); with 127 the product would round first. The resolution
(1/128 per component) costs nothing measurable in retrieval (README, "Recorded embeddings").
"""

from __future__ import annotations

import numpy as np

SCALE = 128.0
LIMIT = 127


def quantize(vec: np.ndarray) -> np.ndarray:
    """The int8 form of a (unit) float vector: round half to even of 128·x, clipped to ±127. In the
    vector's own precision (float32 or float64: ×128 is exact in both)."""
    v = np.asarray(vec)
    if v.dtype not in (np.float32, np.float64):
        v = v.astype(np.float64)
    return np.clip(np.rint(v * SCALE), -LIMIT, LIMIT).astype(np.int8)


MARGIN = 1e-6
"""How close (in units of a unit vector's component) a float32 component may come to a rounding boundary
of `quantize` before the vector is computed again in float64. torch's float32 kernels (AVX-512, AVX2,
baseline) disagree by at most 2.4e-7 on the shared data's texts (benchmarks/bench_kernel_vectors.py); a
component farther than this from a boundary rounds to the same int8 on any of them."""


def near_boundary(vec: np.ndarray, margin: float = MARGIN) -> bool:
    """Whether some component of 128·vec lies within 128·margin of a half-integer (a rounding boundary)."""
    s = np.asarray(vec, dtype=np.float64) * SCALE
    return bool((np.abs(s - np.floor(s) - 0.5) < margin * SCALE).any())


def on_grid(q: np.ndarray) -> np.ndarray:
    """An int8 vector as the unit-scale float32 vector q/128 (exact: 128 is a power of two), the form
    embedding caches store: `quantize` gives back exactly q."""
    return np.asarray(q, dtype=np.float32) / np.float32(SCALE)


def exact(q: np.ndarray) -> np.ndarray:
    """The vector the memory computes with: the int8 values as float32 (each an exact integer)."""
    return np.asarray(q, dtype=np.float32)


def norm_sq(v: np.ndarray) -> float:
    """|v|² of an integer-valued vector, exactly (an integer below 2^23)."""
    return float(np.dot(v.astype(np.float64), v.astype(np.float64)))


def norms_sq(rows: np.ndarray) -> np.ndarray:
    """|row|² of each row, exactly (float64 integers)."""
    r = rows.astype(np.float64)
    return np.einsum("ij,ij->i", r, r)


def cosines_from_dots(dots: np.ndarray, rows_norm_sq: np.ndarray, query_norm_sq: float) -> np.ndarray:
    """Cosines from exact dot products and squared norms: one correctly rounded sqrt and division
    each (elementwise IEEE operations, the same on every CPU). A zero vector has cosine 0."""
    denom = np.sqrt(rows_norm_sq.astype(np.float64) * float(query_norm_sq))
    d = dots.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(denom > 0, d / np.where(denom > 0, denom, 1.0), 0.0)
    return out


def cosines(rows: np.ndarray, query: np.ndarray, rows_norm_sq: np.ndarray | None = None) -> np.ndarray:
    """Cosine of each integer-valued row with an integer-valued query, exactly rounded (float64)."""
    if len(rows) == 0:
        return np.zeros(0, dtype=np.float64)
    dots = rows.astype(np.float32) @ query.astype(np.float32)  # exact: integers below 2^23
    rn = norms_sq(rows) if rows_norm_sq is None else rows_norm_sq
    return cosines_from_dots(dots, rn, norm_sq(query))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine of two integer-valued vectors, exactly rounded."""
    return float(cosines(a.reshape(1, -1), b)[0])
