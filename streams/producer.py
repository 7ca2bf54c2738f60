"""Client side of the Kafka transport: submit a case file as a run, follow a run, collect the changelog.

`submit_run` produces the run's `RunStart` then its cases, in order, keyed by run id (one
partition), with `acks=all` and the idempotent producer. Submitting the same run again is
harmless: the worker recognises every message as already processed.

`submit_runs` / `follow_runs` do the same for several runs at once (a replay's permutations
spread over the workers of a consumer group).

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
from grandrounds.store.eventstore import ConsumedOffset, EventStore
from grandrounds.store.read_model import EventLog
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
    return (await submit_runs(bootstrap, [(run_id, spec, cases)], topics, partitions, replication_factor))[0]


async def submit_runs(bootstrap: str, runs: Sequence[tuple[str, RunSpec, Sequence[Case]]],
                      topics: Topics = Topics(), partitions: int = DEFAULT_PARTITIONS,
                      replication_factor: int | None = None) -> list[Submitted]:
    """Produce several runs through one connection (a replay's permutations): each run's `RunStart`
    then its cases, in order, keyed by its run id. The dead-letter positions are read once, before
    the first message, so a follower sees every letter about any of these runs."""
    n = await ensure_topics(bootstrap, topics, partitions, replication_factor)
    dlq = await _end_offsets(bootstrap, topics.dead_letter)
    broker = KafkaBroker(bootstrap, acks="all", enable_idempotence=True, client_id="grandrounds-submit",
                         log_level=logging.DEBUG, logger=logging.getLogger("grandrounds.faststream"))
    topic = topics.intake
    out = []
    async with broker:
        await broker.connect()
        for run_id, spec, cases in runs:
            key = run_id.encode()
            await broker.publish(RunStart(run_id=run_id, spec=spec, cases=len(cases)), topic, key=key)
            # Pipelined; the idempotent producer keeps them in order within the partition.
            pending = [await broker.publish(CaseMessage(run_id=run_id, index=i, case=c), topic, key=key,
                                            no_confirm=True)
                       for i, c in enumerate(cases)]
            await asyncio.gather(*pending)
            out.append(Submitted(run_id, len(cases), partition_for(run_id, n), n, dlq))
    return out


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
    imported = await follow_runs(bootstrap, [submitted], store, topics, timeout=timeout, on_case=on_case)
    return imported[submitted.run_id]


async def follow_runs(bootstrap: str, submitted: Sequence[Submitted], store: EventStore, topics: Topics = Topics(),
                      timeout: float | None = None, on_case: Callable[[int], None] | None = None,
                      on_run: Callable[[str], None] | None = None, on_stall: Callable[[str], None] | None = None,
                      stall_after: float = 30.0) -> dict[str, int]:
    """Import the runs' events from the changelog until every case of every run is complete.

    One consumer reads the changelog partitions of all the runs (and the dead-letter topic from
    where it stood before the submit). `on_case(1)` per case completed, `on_run(run_id)` once a
    run is whole in `store`, `on_stall(message)` after each `stall_after` seconds without a case
    completed (no worker running, or a slow one). A dead letter about one of the runs raises
    `RunFailed` (`RunRejected` for a run the worker refused); past `timeout` seconds in all,
    `TimeoutError`. Returns run id → events imported.
    """
    wanted = {s.run_id: s for s in submitted}
    imported = {rid: 0 for rid in wanted}
    if not wanted:
        return imported
    log_reader = EventLog(store)
    completed = {rid: log_reader.completed_cases(rid) for rid in wanted}
    open_runs = set()
    for rid, s in wanted.items():
        if completed[rid] >= s.cases:
            if on_run is not None:
                on_run(rid)
        else:
            open_runs.add(rid)
    if not open_runs:
        return imported
    consumer = changelog_consumer(bootstrap, client_id="grandrounds-follow")
    await consumer.start()
    log_tps = sorted({TopicPartition(topics.changelog, s.partition) for s in submitted})
    dlq_starts: dict[int, int] = {}
    for s in submitted:  # the earliest position any submit saw: no letter about these runs is missed
        for p, off in s.dead_letter_offsets.items():
            dlq_starts[p] = min(off, dlq_starts.get(p, off))
    dlq_tps = {TopicPartition(topics.dead_letter, p): o for p, o in dlq_starts.items()}
    importer = ChangelogImporter(store, runs=lambda r: r in wanted)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    last_progress = loop.time()
    try:
        consumer.assign([*log_tps, *dlq_tps])
        await consumer.seek_to_beginning(*log_tps)
        for tp, off in dlq_tps.items():
            consumer.seek(tp, off)
        while open_runs:
            now = loop.time()
            if deadline is not None and now > deadline:
                left = ", ".join(f"{rid} {completed[rid]}/{wanted[rid].cases}" for rid in sorted(open_runs))
                raise TimeoutError(f"{len(open_runs)} of {len(wanted)} run(s) not complete after {timeout:.0f}s "
                                   f"(cases done: {left}); is a worker running on this broker?")
            if on_stall is not None and now - last_progress > stall_after:
                on_stall(f"no case completed in the last {now - last_progress:.0f}s ({len(open_runs)} run(s) "
                         f"open); waiting for a worker on topics {topics.intake}…")
                last_progress = now
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            for tp, records in batches.items():
                for rec in records:
                    if tp.topic == topics.dead_letter:
                        rid = rec.key.decode("utf-8", "replace") if rec.key is not None else None
                        if rid in wanted:
                            letter = DeadLetter.model_validate_json(rec.value)
                            raise run_failed(f"run {rid}: {letter.reason} message on {letter.source_topic}: "
                                             f"{letter.error}", reason=letter.reason)
                        continue
                    span = batch_span(rec.headers)
                    if span is not None and span[0] not in wanted:
                        continue
                    importer.add(rec.headers, rec.value)
            before = dict(importer.tally.imported)
            importer.flush()
            for rid in wanted:
                if rid in importer.tally.diverged:
                    raise RunFailed(f"run {rid}: the changelog does not continue {store.path}'s copy of the run "
                                    f"({importer.tally.diverged[rid]})")
                new = importer.tally.imported.get(rid, 0) - before.get(rid, 0)
                if not new:
                    continue
                imported[rid] += new
                now_done = log_reader.completed_cases(rid)
                if now_done > completed[rid]:
                    last_progress = loop.time()
                    if on_case is not None:
                        for _ in range(now_done - completed[rid]):
                            on_case(1)
                completed[rid] = now_done
                if rid in open_runs and now_done >= wanted[rid].cases:
                    open_runs.discard(rid)
                    if on_run is not None:
                        on_run(rid)
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
