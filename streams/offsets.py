"""Consumed-offset bookkeeping for one topic-partition whose messages finish out of order.

A partition holds several runs, and a run's messages wait for their turn (case i+1 waits
for case i), so messages of one partition complete out of offset order. The position that
is safe to store or commit is the lowest offset not yet done: everything below it is
processed. Resuming there can redeliver messages that were already processed; the worker
recognises those from the log and skips them.

A message can also be delivered before the consumer fetches it: the worker produced it
(a run's next stage command, to a partition the worker owns) and took it up at once; the
broker's acknowledgement gives its offset (`delivered_own`). The consumer's later copy of it
is recognised (`delivered` returns False) and not delivered twice. (A copy fetched before the
acknowledgement is matched to its step by the worker instead.) Such an offset only moves
the safe position once every offset below it has been fetched: other producers' messages
may sit in between.
"""

from __future__ import annotations

import heapq


class PartitionOffsets:
    def __init__(self, start: int | None):
        self.start = start
        self.high = -1 if start is None else start
        """One past the highest offset the consumer fetched (its position); -1: unknown yet."""
        self._heap: list[int] = []
        self._open: set[int] = set()  # delivered, not done
        self._own: set[int] = set()  # delivered by a produce acknowledgement, not fetched yet
        self.dirty = False
        self.committed = -1 if start is None else start
        """The position last committed to the group (Kafka)."""
        self.stored = -1 if start is None else start
        """The position last written to the worker's DuckDB file."""

    def delivered(self, offset: int) -> bool:
        """The consumer fetched `offset`. False: it was delivered already (`delivered_own`)."""
        if offset + 1 > self.high:
            self.high = offset + 1
        if offset in self._own:
            self._own.discard(offset)
            return False
        self._open.add(offset)
        heapq.heappush(self._heap, offset)
        return True

    def delivered_own(self, offset: int) -> bool:
        """A message this worker produced and took up itself was acknowledged at `offset`: open it,
        and recognise the consumer's copy. False: the consumer has fetched it already."""
        if offset < self.high or offset in self._own:
            return False
        self._own.add(offset)
        self._open.add(offset)
        heapq.heappush(self._heap, offset)
        return True

    def is_own(self, offset: int) -> bool:
        """Whether a fetched `offset` is the consumer's copy of a message delivered ahead."""
        return offset in self._own

    def done(self, offset: int) -> None:
        if offset not in self._open:
            return
        self._open.discard(offset)
        while self._heap and self._heap[0] not in self._open:
            heapq.heappop(self._heap)
        self.dirty = True

    @property
    def pending(self) -> int:
        return len(self._open)

    def watermark(self, assuming_done: int | set[int] | None = None) -> int:
        """The next offset to resume from; with `assuming_done`, as if those messages were finished.

        -1 when nothing can be vouched for yet (nothing fetched since an assignment without a
        known start).
        """
        if self.high < 0:
            return -1
        frontier = self.high  # everything below was fetched; own offsets right after it are known too
        while frontier in self._own:
            frontier += 1
        extra = {assuming_done} if isinstance(assuming_done, int) else (assuming_done or set())
        if not self._heap:
            return frontier
        top = self._heap[0]  # invariant kept by `done`: the heap's top is open
        if top not in extra:
            return min(top, frontier)
        rest = [o for o in self._open if o not in extra]
        return min(min(rest), frontier) if rest else frontier
