"""Seeded case orders for order-sensitivity replays.

Permutation k of a replay with seed S is drawn by numpy's PCG64 from its own `order_seed`,
derived from (S, k) by a SeedSequence: the same seed gives the same orders on any machine
and for any number of permutations (asking for 5 after 3 repeats the first 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Permutation:
    k: int
    """Index of the permutation within the replay, from 0."""
    order_seed: int
    """The seed its order was drawn from (recorded in replay output, reproducible alone)."""
    order: tuple[int, ...]
    """order[i] = position in the source case log of the i-th case of this run."""


def order_seed(seed: int, k: int) -> int:
    if seed < 0 or k < 0:
        raise ValueError("seeds and permutation indices must be non-negative")
    return int(np.random.SeedSequence([seed, k]).generate_state(1, dtype=np.uint32)[0])


def order_from_seed(n: int, seed: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.random.default_rng(seed).permutation(n))


def permutations(n: int, count: int, seed: int) -> list[Permutation]:
    out = []
    for k in range(count):
        s = order_seed(seed, k)
        out.append(Permutation(k, s, order_from_seed(n, s)))
    return out
