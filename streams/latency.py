"""A latency histogram of bounded size for a worker that runs for weeks.

Log-spaced buckets (each 5 % wider than the last, from 1 µs to about 3 hours: a few hundred counters)
replace lists that grew by one float per stage for the worker's life. Quantiles are the upper edge of
the bucket they fall in, so within 5 % of the exact value; count, max and mean are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_RATIO = 1.05
_LOWEST_MS = 0.001
_BUCKETS = int(math.log(1e7 / _LOWEST_MS, _RATIO)) + 2  # up to ~1e7 ms; anything above lands in the last


@dataclass
class LatencyHistogram:
    counts: dict[int, int] = field(default_factory=dict)
    """bucket -> samples (sparse: only buckets that saw a sample)."""
    n: int = 0
    total: float = 0.0
    max: float = 0.0

    def add(self, ms: float) -> None:
        ms = max(0.0, float(ms))
        b = 0 if ms <= _LOWEST_MS else min(_BUCKETS - 1, int(math.log(ms / _LOWEST_MS, _RATIO)) + 1)
        self.counts[b] = self.counts.get(b, 0) + 1
        self.n += 1
        self.total += ms
        self.max = max(self.max, ms)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1), as its bucket's upper edge (never above the exact max); None if empty."""
        if not self.n:
            return None
        rank = min(self.n - 1, int(q * self.n))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen > rank:
                return min(self.max, _LOWEST_MS * _RATIO ** b)
        return self.max

    def __len__(self) -> int:
        return self.n
