"""Smoke test of tests/kafka_broker.py against a real Kafka 4.x broker.

Needs the jars (`bash .ci/kafka/fetch.sh`) and java 17+; skips without them.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from kafka_broker import KafkaBroker, java_executable, kafka_libs_dir

aiokafka = pytest.importorskip("aiokafka")

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(kafka_libs_dir() is None, reason="Kafka jars absent: run `bash .ci/kafka/fetch.sh`"),
    pytest.mark.skipif(java_executable() is None, reason="java not found (Kafka 4.x needs JDK 17+)"),
]


@pytest.fixture(scope="module")
def broker():
    with KafkaBroker() as b:
        print(f"Kafka broker at {b.bootstrap} started in {b.start_seconds:.1f}s")
        yield b


async def _consume(consumer, n: int, timeout: float = 30.0) -> list:
    got: list = []

    async def loop() -> None:
        while len(got) < n:
            batches = await consumer.getmany(timeout_ms=500)
            for msgs in batches.values():
                got.extend(msgs)

    await asyncio.wait_for(loop(), timeout)
    return got


@pytest.mark.asyncio
async def test_idempotent_produce_and_group_commit(broker: KafkaBroker) -> None:
    topic = f"smoke-{uuid.uuid4().hex[:8]}"  # auto-created on first use
    group = f"g-{uuid.uuid4().hex[:8]}"
    values = [b"m0", b"m1", b"m2"]

    producer = aiokafka.AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        metas = [await producer.send_and_wait(topic, v, key=b"run-1") for v in values]
    finally:
        await producer.stop()
    assert len({m.partition for m in metas}) == 1, "one key must map to one partition"
    assert [m.offset for m in metas] == sorted(m.offset for m in metas)

    def consumer():
        return aiokafka.AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )

    c1 = consumer()
    await c1.start()
    try:
        msgs = await _consume(c1, 3)
        assert [m.value for m in msgs] == values
        assert {m.key for m in msgs} == {b"run-1"}
        # Commit past the 2nd message only: the group must resume at the 3rd.
        tp = aiokafka.TopicPartition(topic, msgs[1].partition)
        await c1.commit({tp: msgs[1].offset + 1})
    finally:
        await c1.stop()

    c2 = consumer()
    await c2.start()
    try:
        rest = await _consume(c2, 1)
        assert await c2.committed(tp) == msgs[1].offset + 1
        assert [m.value for m in rest] == [b"m2"]
    finally:
        await c2.stop()
