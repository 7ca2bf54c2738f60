"""The consumer group's committed offsets (Kafka's side; DuckDB holds the authoritative ones).

The group's offsets only matter to a worker without this one's file (a takeover), which skips
what it finds done in the log anyway; DuckDB stores the position with each step's events
(commit.py), and that is where a worker resumes. A failed group commit is retried next round and
logged as a warning: it is worth seeing, never fatal.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import TopicPartition

log = logging.getLogger("grandrounds.kafka")


class GroupOffsets:
    """KafkaWorker's part that commits the group's offsets (state: `consumers`, `offsets`, `topics`)."""

    def start(self) -> None:
        if self._group_committer is None:
            self._group_committer = asyncio.create_task(self._commit_loop())

    async def _commit_loop(self, every: float = 1.0) -> None:
        # The group's offsets only matter to a worker without this one's file (a takeover), which
        # skips what it finds done in the log anyway; each round is a request per stage consumer,
        # so once a second (Kafka's own auto-commit waits 5 s). Revocation and shutdown commit at once.
        while True:
            await asyncio.sleep(every)
            try:
                await self.commit_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failed commit is retried next round
                log.warning("offset commit failed", exc_info=True)

    async def commit_all(self, only: set[tuple[str, int]] | None = None) -> None:
        for stage, consumer in list(self.consumers.items()):
            topic = self.topics.stage(stage)
            offsets = {}
            for (t, p), tracker in list(self.offsets.items()):
                if t != topic or (only is not None and (t, p) not in only):
                    continue
                mark = tracker.watermark()
                if tracker.dirty and mark > tracker.committed:
                    offsets[TopicPartition(t, p)] = mark
            if not offsets:
                continue
            try:
                await consumer.commit(offsets)
            except Exception as exc:  # noqa: BLE001 - rebalancing, or no longer assigned
                log.warning("offset commit %s failed: %s", offsets, exc)
                continue
            for tp, mark in offsets.items():
                tracker = self.offsets.get((tp.topic, tp.partition))
                if tracker is not None:
                    tracker.committed = mark
                    tracker.dirty = False
