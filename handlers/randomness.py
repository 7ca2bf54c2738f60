"""Seeded randomness: one generator per (run seed, case, purpose), never global state.

PCG64 from explicit integer seeds gives the same stream on every machine, so anything
random in a payload is reproducible from the run's seed and the case's identity, and
independent of the order cases arrive in.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from grandrounds.store.canonical import sha256_hex


@lru_cache(maxsize=4096)
def _word(text: str) -> int:
    # memoised: the purposes are a handful of constants, and each case id is hashed for every purpose
    # (a sha256 each time); a pure function of the text.
    return int(sha256_hex(text)[:15], 16)


def case_rng(seed: int, case_id: str, purpose: str) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, _word(case_id), _word(purpose)])
