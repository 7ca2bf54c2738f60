"""Messages coming in: echoes dropped before decoding, validated ones handed to their run, dead letters.

`accept` returns at once (the run's actor does the work), so each consumer keeps polling.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from grandrounds.store.eventstore import ConsumedOffset
from grandrounds.streams.kafka_worker.actor import RunActor
from grandrounds.streams.kafka_worker.delivery import Delivery, DeliveryState, step_key
from grandrounds.streams.messages import DeadLetter

log = logging.getLogger("grandrounds.kafka")


class Intake:
    """KafkaWorker's part that takes messages in (state: `offsets`, `actors`, `takeovers`, `paused`)."""

    def attach(self, stage: str, consumer: AIOKafkaConsumer) -> None:
        self.consumers[stage] = consumer
        self._skip_echoes(consumer)

    def _skip_echoes(self, consumer: AIOKafkaConsumer) -> None:
        """Drop the consumer's copies of commands this worker took up on their produce ack as they are
        fetched, before FastStream builds a message for them: four of a case's five stage messages
        are such copies, and FastStream's per-message work cost more than the rest of their handling."""
        if getattr(consumer, "_grandrounds_skips_echoes", False):
            return
        fetch_one = consumer.getone  # what FastStream's consume loop awaits for each message

        async def getone(*partitions):
            while True:
                record = await fetch_one(*partitions)
                if not self.echo(record):
                    return record

        consumer.getone = getone
        consumer._grandrounds_skips_echoes = True

    # --- intake ------------------------------------------------------------------------

    async def accept(self, stage: str, body: Any, record: Any) -> None:
        """A validated message from a stage subscriber. Returns at once; the run's task does the work."""
        tp = (record.topic, record.partition)
        takeover = self.takeovers.get(record.partition)
        if takeover is not None and not takeover.done():
            # Restore before processing (only right after an assignment). Waited for, never awaited:
            # a takeover ends by succeeding or by being cancelled with a revoke, and neither is this
            # message's fault (a revoked partition's message is delivered again to its next owner).
            await asyncio.wait([takeover])
        tracker = self.offsets.get(tp)
        if not self.accepting or tracker is None:
            return  # fetched before a revoke or shutdown; it will be delivered again
        run_id = body.run_id
        if record.key is None or record.key.decode("utf-8", "replace") != run_id:
            await self.dead_letter("invalid", f"message key {record.key!r} is not its run_id {run_id!r}; "
                                   "messages must be keyed by run id", record)
            return
        key = step_key(stage, body)
        if not tracker.delivered(record.offset):
            self.stats.echoes += 1  # a command this worker produced and has processed (or is processing) already
            return
        actor = self.actors.get(run_id)
        if actor is not None and actor.copy_of_ahead(stage, key, record.offset):
            self.stats.echoes += 1  # fetched before its produce ack came back: the run took it up already
            self.stats.early_copies += 1
            self.committer.schedule()
            return
        delivery = Delivery(stage, body, record.topic, record.partition, record.offset,
                            int(record.timestamp or 0), time.monotonic(), key)
        if actor is None:
            actor = self.actors[run_id] = RunActor(self, run_id, record.partition)
        actor.deliver(delivery)
        if tracker.pending > self.max_buffered and tp not in self.paused:
            consumer = self.consumers.get(stage)
            if consumer is not None:
                consumer.pause(TopicPartition(*tp))
                self.paused.add(tp)

    def echo(self, record: Any) -> bool:
        """Whether a fetched record is the consumer's copy of a command this worker delivered to itself.

        Called before the record is decoded: such a copy needs no validation and no work.
        """
        tracker = self.offsets.get((record.topic, record.partition))
        if tracker is None or not tracker.is_own(record.offset):
            return False
        tracker.delivered(record.offset)
        self.stats.echoes += 1
        if tracker.watermark() > tracker.stored:
            self.committer.schedule()  # the step may be in the file already: store the position it freed
        return True

    def owns(self, topic: str, partition: int) -> bool:
        """Whether this worker consumes that topic-partition now (so it may deliver its messages itself)."""
        return self.accepting and (topic, partition) in self.offsets

    async def dead_letter(self, reason: str, error: str, record: Any) -> None:
        """Send a message the worker cannot use to the dead-letter topic, then count it consumed."""
        letter = DeadLetter.of(reason, error, record.topic, record.partition, record.offset, record.key, record.value)
        if self.publish_dead_letter is not None:
            await self.publish_dead_letter(letter, record.key)
        self.stats.dead_letters += 1
        log.warning("dead letter (%s) from %s[%d]@%d: %s", reason, record.topic, record.partition,
                    record.offset, error.splitlines()[0] if error else "")
        tracker = self.offsets.get((record.topic, record.partition))
        if tracker is not None and tracker.delivered(record.offset):
            tracker.done(record.offset)
            self.committer.schedule()  # its position goes to DuckDB with the next commit

    def finished(self, d: Delivery) -> None:
        if d.state is DeliveryState.AHEAD:
            # Done once its offset is known (the ack's callback, which sets it, was registered
            # first, so it runs first).
            d.sent.add_done_callback(lambda _f: d.offset_known and self.finished(d))
            return
        if d.state is DeliveryState.LOST:
            return  # never in Kafka: no offset to mark done (the kick produces the command again)
        tp = (d.topic, d.partition)
        tracker = self.offsets.get(tp)
        if tracker is None:
            return
        tracker.done(d.offset)
        if tp in self.paused and tracker.pending < self.max_buffered // 2:
            consumer = self.consumers.get(self.topics.stage_of(d.topic))
            if consumer is not None:
                consumer.resume(TopicPartition(*tp))
            self.paused.discard(tp)

    def consumed(self, d: Delivery) -> ConsumedOffset:
        """The position to store with this delivery's events: as if it were finished."""
        tracker = self.offsets.get((d.topic, d.partition))
        nxt = tracker.watermark(assuming_done=d.offset) if tracker is not None else d.offset + 1
        return ConsumedOffset(self.group_id, d.topic, d.partition, nxt)
