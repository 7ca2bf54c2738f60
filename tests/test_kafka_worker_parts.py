"""Parts of the Kafka worker package that need no broker: Delivery's states, a failing takeover.

(tests/test_kafka_worker.py runs the same behaviour against a real broker.)
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from grandrounds.store.errors import Bug
from grandrounds.streams.kafka_worker import Delivery, DeliveryState, KafkaWorker
from grandrounds.streams.messages import StageCommand
from grandrounds.streams.offsets import PartitionOffsets
from grandrounds.streams.topics import Topics


def _worker() -> KafkaWorker:
    return KafkaWorker(None, None, bootstrap="127.0.0.1:9", topics=Topics("t."), group_id="g", worker_id="w",
                       partitions=1)


def test_a_delivery_states_where_it_stands_and_refuses_impossible_moves():
    fetched = Delivery("act", None, "t.act", 0, 7, 0, 0.0, (0, 1))
    assert fetched.state is DeliveryState.FETCHED and fetched.offset_known
    with pytest.raises(Bug):
        fetched.acknowledge(8)  # a fetched message has its offset already
    with pytest.raises(Bug):
        Delivery("act", None, "t.act", 0, None, 0, 0.0, (0, 1))  # from the consumer, without an offset

    ahead = Delivery("act", None, "t.act", 0, None, 0, 0.0, (0, 1), own=True)
    assert ahead.state is DeliveryState.AHEAD and not ahead.offset_known
    ahead.acknowledge(9)
    assert ahead.state is DeliveryState.ACKED and ahead.offset == 9
    with pytest.raises(Bug):
        ahead.lose(RuntimeError("refused"))  # an acknowledged command is in Kafka

    lost = Delivery("act", None, "t.act", 0, None, 0, 0.0, (0, 1), own=True)
    lost.lose(RuntimeError("refused"))
    assert lost.state is DeliveryState.LOST and lost.offset is None and not lost.offset_known


async def test_a_lost_delivery_is_never_marked_done():
    w = _worker()
    try:
        tracker = w.offsets[("t.act", 0)] = PartitionOffsets(0)
        tracker.delivered(0)
        d = Delivery("act", None, "t.act", 0, None, 0, 0.0, (0, 1), own=True,
                     sent=asyncio.get_running_loop().create_future())
        d.lose(RuntimeError("refused"))
        w.finished(d)
        assert tracker.pending == 1 and tracker.watermark() == 0  # offset 0 is another message, still open
    finally:
        w.committer.close()


async def test_a_failing_takeover_is_retried_and_its_waiting_messages_are_not_dead_lettered():
    """The changelog unreachable for a moment during a takeover: the partition's messages wait for the
    retry. (They were sent to the dead letters with the takeover's exception: a client following the
    run stops at a dead letter.)"""
    w = _worker()
    w.takeover_retry = (0.01, 0.02)
    letters, attempts, delivered = [], [], []
    try:
        async def publish_dead_letter(letter, key):
            letters.append(letter)

        async def take_over_once(parts):
            attempts.append(parts)
            if len(attempts) < 3:
                raise ConnectionError("changelog unreachable (test)")

        w.publish_dead_letter = publish_dead_letter
        w._take_over_once = take_over_once
        w.offsets[("t.act", 0)] = PartitionOffsets(0)
        w.takeovers[0] = asyncio.create_task(w._take_over([0]))
        w.owners[0].add("act")

        class Actor:  # stands for the run's RunActor: records what it is handed
            def __init__(self, *args):
                pass

            def deliver(self, d):
                delivered.append(d)

            def copy_of_ahead(self, *args):
                return False

        import grandrounds.streams.kafka_worker.intake as intake
        real, intake.RunActor = intake.RunActor, Actor
        try:
            record = SimpleNamespace(topic="t.act", partition=0, offset=0, key=b"r", value=b"{}", timestamp=0)
            await w.accept("act", StageCommand(run_id="r", index=0, case_id="c"), record)
        finally:
            intake.RunActor = real
        assert len(attempts) == 3 and w.stats.takeover_failures == 2
        assert letters == [] and w.stats.dead_letters == 0
        assert [d.offset for d in delivered] == [0]  # handed to its run once the takeover succeeded
    finally:
        w.committer.close()


async def test_a_takeover_failing_for_a_bug_gives_up_after_a_few_attempts_instead_of_blocking_for_ever():
    """Only infrastructure failures are retried for as long as they last: a takeover that fails
    deterministically (a bug) would otherwise hold its partitions' messages for ever."""
    w = _worker()
    w.takeover_retry = (0.01, 0.02)
    attempts = []
    try:
        async def take_over_once(parts):
            attempts.append(parts)
            raise KeyError("a bug (test)")

        w._take_over_once = take_over_once
        await asyncio.wait_for(w._take_over([0]), 5)
        assert len(attempts) == w.max_takeover_attempts and w.stats.takeover_failures == len(attempts)
    finally:
        w.committer.close()
