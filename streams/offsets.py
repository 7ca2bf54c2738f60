"""Consumed-offset bookkeeping for one topic-partition whose messages finish out of order.

A partition holds several runs, and a run's messages wait for their turn (case i+1 waits
for case i), so messages of one partition complete out of offset order. The position that
is safe to store or commit is the lowest offset not yet done: everything below it is
processed. Resuming there can redeliver messages that were already processed; the worker
recognises those from the log and skips them.
"""

from __future__ import annotations

import heapq


class PartitionOffsets:
    def __init__(self, start: int | None):
        self.start = start
        self.high = -1 if start is None else start  # one past the highest offset delivered; -1: unknown
        self._pending: list[int] = []
        self._done: set[int] = set()
        self.dirty = False
        self.committed = -1 if start is None else start

    def delivered(self, offset: int) -> None:
        heapq.heappush(self._pending, offset)
        if offset + 1 > self.high:
            self.high = offset + 1

    def done(self, offset: int) -> None:
        self._done.add(offset)
        while self._pending and self._pending[0] in self._done:
            self._done.discard(heapq.heappop(self._pending))
        self.dirty = True

    @property
    def pending(self) -> int:
        return len(self._pending) - len(self._done)

    def watermark(self, assuming_done: int | set[int] | None = None) -> int:
        """The next offset to resume from; with `assuming_done`, as if those messages were finished."""
        # Invariant kept by `done`: the heap's top is never a finished offset.
        if not self._pending:
            return self.high
        extra = {assuming_done} if isinstance(assuming_done, int) else (assuming_done or set())
        top = self._pending[0]
        if top not in extra:
            return top
        rest = [o for o in self._pending if o not in extra and o not in self._done]
        return min(rest) if rest else self.high
