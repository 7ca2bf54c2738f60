"""Client side of the Kafka transport: submit a case file as a run, follow a run, collect the changelog.

`submit_run` produces the run's `RunStart` then its cases, in order, keyed by run id (one
partition), with `acks=all` and the idempotent producer. Submitting the same run again is
harmless: the worker recognises every message as already processed.

`follow_run` imports the run's events from the changelog into a local DuckDB file as they
arrive, until every case is complete (or a dead letter says the run failed), so the client
ends with a full copy of the run's log — the same bytes the worker's file holds.
"""

from __future__ import annotations

from grandrounds.store.errors import GrandroundsError, InvalidInput
import asyncio
import logging
from dataclasses import dataclass
from typing import Callable, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from faststream.kafka import KafkaBroker

from grandrounds.handlers.cases import Case
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.event_types import CaseCompleted
from grandrounds.store.eventstore import ConsumedOffset, EventStore
from grandrounds.streams.changelog import ChangelogImporter, ImportTally, batch_span, changelog_consumer, import_partitions
from grandrounds.streams.messages import CaseMessage, DeadLetter, RunStart
from grandrounds.streams.topics import DEFAULT_PARTITIONS, Topics, ensure_topics, partition_count, partition_for

log = logging.getLogger("grandrounds.kafka")


class RunFailed(GrandroundsError, RuntimeError):
    """A dead letter reports that the worker rejected or could not process part of the run."""

    def __init__(self, message: str, reason: str = "failed"):
        super().__init__(message)
        self.reason = reason
        """The dead letter's reason: `rejected` is a run the worker refused to open (a run id
        that names a run of another configuration): bad input, like the embedded runner's."""


class RunRejected(RunFailed, InvalidInput):
    """The worker refused to open the run (its id names a run of another configuration): bad input,
    exit 2, as the embedded runner refuses it."""


def run_failed(message: str, reason: str = "failed") -> RunFailed:
    return (RunRejected if reason == "rejected" else RunFailed)(message, reason)


@dataclass
class Submitted:
    run_id: str
    cases: int
    partition: int
    partitions: int
    dead_letter_offsets: dict[int, int]
    """End offsets of the dead-letter topic just before the submit (where to watch from)."""


async def submit_run(bootstrap: str, run_id: str, spec: RunSpec, cases: Sequence[Case],
                     topics: Topics = Topics(), partitions: int = DEFAULT_PARTITIONS,
                     replication_factor: int | None = None) -> Submitted:
    if spec.lag:  # the worker runs a case's stages strictly in order: it would write other bytes than `run --lag`
        raise ValueError(f"lag {spec.lag}: a lagged run (memory pinned k cases back) runs on the embedded runner "
                         "only; the Kafka worker runs cases strictly in order (lag 0)")
    n = await ensure_topics(bootstrap, topics, partitions, replication_factor)
    dlq = await _end_offsets(bootstrap, topics.dead_letter)
    broker = KafkaBroker(bootstrap, acks="all", enable_idempotence=True, client_id="grandrounds-submit",
                         log_level=logging.DEBUG, logger=logging.getLogger("grandrounds.faststream"))
    key = run_id.encode()
    topic = topics.stage("retrieve")
    async with broker:
        await broker.connect()
        await broker.publish(RunStart(run_id=run_id, spec=spec, cases=len(cases)), topic, key=key)
        # Pipelined; the idempotent producer keeps them in order within the partition.
        pending = [await broker.publish(CaseMessage(run_id=run_id, index=i, case=c), topic, key=key, no_confirm=True)
                   for i, c in enumerate(cases)]
        await asyncio.gather(*pending)
    return Submitted(run_id, len(cases), partition_for(run_id, n), n, dlq)


async def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = range(await partition_count(bootstrap, topic))
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in parts])
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


async def follow_run(bootstrap: str, submitted: Submitted, store: EventStore, topics: Topics = Topics(),
                     timeout: float | None = None, on_case: Callable[[int], None] | None = None) -> int:
    """Import the run's events from the changelog until all its cases are complete; returns events imported."""
    run_id = submitted.run_id
    consumer = changelog_consumer(bootstrap, client_id="grandrounds-follow")
    await consumer.start()
    log_tp = TopicPartition(topics.changelog, submitted.partition)
    dlq_tps = {TopicPartition(topics.dead_letter, p): o for p, o in submitted.dead_letter_offsets.items()}
    consumer.assign([log_tp, *dlq_tps])
    await consumer.seek_to_beginning(log_tp)
    for tp, off in dlq_tps.items():
        consumer.seek(tp, off)
    importer = ChangelogImporter(store, runs=lambda r: r == run_id)
    completed = sum(1 for _ in store.iter(run_id, types=[CaseCompleted.event_type]))
    imported = 0
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    try:
        while completed < submitted.cases:
            if deadline is not None and loop.time() > deadline:
                raise TimeoutError(f"run {run_id}: {completed} of {submitted.cases} cases complete after "
                                   f"{timeout:.0f}s; is a worker running on this broker?")
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            for tp, records in batches.items():
                for rec in records:
                    if tp.topic == topics.dead_letter:
                        if rec.key is not None and rec.key.decode("utf-8", "replace") == run_id:
                            letter = DeadLetter.model_validate_json(rec.value)
                            raise run_failed(f"run {run_id}: {letter.reason} message on {letter.source_topic}: "
                                            f"{letter.error}", reason=letter.reason)
                        continue
                    span = batch_span(rec.headers)
                    if span is not None and span[0] != run_id:
                        continue
                    importer.add(rec.headers, rec.value)
            before = importer.tally.imported.get(run_id, 0)
            importer.flush()
            if run_id in importer.tally.diverged:
                raise RunFailed(f"run {run_id}: the changelog does not continue {store.path}'s copy of the run "
                                f"({importer.tally.diverged[run_id]})")
            new = importer.tally.imported.get(run_id, 0) - before
            if new:
                imported += new
                now = sum(1 for _ in store.iter(run_id, types=[CaseCompleted.event_type]))
                if on_case is not None:
                    for _ in range(now - completed):
                        on_case(1)
                completed = now
    finally:
        await consumer.stop()
    return imported


async def collect(bootstrap: str, store: EventStore, topics: Topics = Topics(),
                  run_ids: Sequence[str] | None = None, group: str = "collect") -> ImportTally:
    """Bring every run (or the given ones) of the changelog into `store`: a combined audit database.

    Incremental: the changelog position reached is stored in the file, so a second collect
    reads only what is new.
    """
    wanted = set(run_ids or ())
    consumer = changelog_consumer(bootstrap, client_id="grandrounds-collect")
    await consumer.start()
    try:
        parts = range(await partition_count(bootstrap, topics.changelog))
        stored = store.consumer_offsets(group)
        starts = {p: (0 if wanted else stored.get((topics.changelog, p), 0)) for p in sorted(parts)}
        tally = await import_partitions(consumer, topics.changelog, starts, store,
                                        runs=(lambda r: r in wanted) if wanted else None)
    finally:
        await consumer.stop()
    if not wanted and not tally.diverged:
        for p, off in tally.next_offsets.items():
            store.save_offset(ConsumedOffset(group, topics.changelog, p, off))
    return tally
