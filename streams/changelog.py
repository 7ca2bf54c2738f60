"""The changelog topic: every appended batch of events, one message per batch, keyed by run id.

It is the replicated copy of the workers' DuckDB files, as a Kafka Streams changelog is of
its state stores. A worker newly assigned partition p reads changelog partition p (the same
runs, see `streams.topics`) and imports the events its file lacks before processing; a
client following a run, or building a combined audit database, reads it the same way.

Headers carry `run_id`, `first_seq` and `last_seq`, so a reader skips batches it already has
without parsing them. Imports go through `EventStore.import_events`, which re-checks the
hash chain: a changelog cannot smuggle altered payloads into a log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from grandrounds.store.events import StoredEvent
from grandrounds.store.eventstore import EventStore, StoreError

log = logging.getLogger("grandrounds.kafka")


def encode_batch(events: Sequence[StoredEvent]) -> tuple[bytes, list[tuple[str, bytes]]]:
    """One changelog message: {"run_id", "events": [envelope + payload, ...]}, compact JSON.

    Each payload goes in as the canonical JSON the writer already built for its chain hash
    (`StoredEvent.canonical_payload`): serialising it again cost as much as the rest of the step.
    """
    run_id = events[0].run_id
    parts = []
    for e in events:
        envelope = _dumps({"seq": e.seq, "type": e.type, "schema_version": e.schema_version, "case_id": e.case_id,
                           "causation_seq": e.causation_seq, "meta": e.meta, "chain": e.chain})
        parts.append(f'{envelope[:-1]},"payload":{e.canonical_payload()}}}')
    body = f'{{"run_id":{_dumps(run_id)},"events":[{",".join(parts)}]}}'
    headers = [("run_id", run_id.encode()), ("first_seq", str(events[0].seq).encode()),
               ("last_seq", str(events[-1].seq).encode()), ("content-type", b"application/json")]
    return body.encode("utf-8"), headers


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def batch_span(headers: Iterable[tuple[str, bytes]]) -> tuple[str, int, int] | None:
    h = dict(headers or ())
    try:
        return h["run_id"].decode(), int(h["first_seq"]), int(h["last_seq"])
    except (KeyError, ValueError):
        return None


def decode_batch(value: bytes) -> list[StoredEvent]:
    body = json.loads(value)
    run_id = body["run_id"]
    return [StoredEvent(run_id, int(e["seq"]), e["type"], int(e["schema_version"]), e["case_id"],
                        e["causation_seq"], e["payload"], e["meta"], e["chain"]) for e in body["events"]]


@dataclass
class ImportTally:
    imported: dict[str, int] = field(default_factory=dict)
    """run id → events imported."""
    diverged: dict[str, str] = field(default_factory=dict)
    """run id → why its changelog could not be applied (a gap, or a chain that disagrees)."""
    next_offsets: dict[int, int] = field(default_factory=dict)
    """partition → offset after the last changelog record read."""


class ChangelogImporter:
    """Applies changelog records to a store: the events of each run beyond its local head.

    Records are buffered per run and imported in large contiguous slices (one transaction
    each) rather than one transaction per batch.
    """

    def __init__(self, store: EventStore, runs: Callable[[str], bool] | None = None, flush_every: int = 20_000):
        self.store = store
        self.wants = runs or (lambda run_id: True)
        self.flush_every = flush_every
        self._heads: dict[str, int] = {}
        self._pending: dict[str, list[StoredEvent]] = {}
        self._buffered = 0
        self._beyond: dict[str, tuple[int, int]] = {}
        """run id → (first, last) seq of the furthest batch read that started past the run's head."""
        self.tally = ImportTally()

    def _head(self, run_id: str) -> int:
        if run_id not in self._heads:
            self._heads[run_id] = self.store.last_seq(run_id)
        return self._heads[run_id]

    def add(self, headers, value: bytes) -> None:
        span = batch_span(headers)
        if span is None:
            events = decode_batch(value)
            if not events:
                return
            span = (events[0].run_id, events[0].seq, events[-1].seq)
        else:
            events = None
        run_id, first, last = span
        if run_id in self.tally.diverged or not self.wants(run_id):
            return
        head = self._head(run_id)
        if last <= head:
            return  # already in the log (our own batch, or imported before)
        if first > head + 1:
            # A batch past a hole. A worker publishes a run's next batch before the broker has
            # acknowledged the one before (the run goes on meanwhile); should that one fail, the
            # worker restores the run and publishes the missing steps again, after this batch. So
            # skip it: the steps come again in order, and `finish` reports a hole nothing filled.
            if last > self._beyond.get(run_id, (0, -1))[1]:
                self._beyond[run_id] = (first, last)
            return
        events = [e for e in (events or decode_batch(value)) if e.seq > head]
        self._pending.setdefault(run_id, []).extend(events)
        self._heads[run_id] = events[-1].seq
        self._buffered += len(events)
        if self._buffered >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        for run_id, events in self._pending.items():
            try:
                self.store.import_events(events)
            except StoreError as exc:
                self.tally.diverged[run_id] = str(exc)
                self._heads.pop(run_id, None)
                log.error("changelog import of run %s refused: %s", run_id, exc)
                continue
            self.tally.imported[run_id] = self.tally.imported.get(run_id, 0) + len(events)
        self._pending.clear()
        self._buffered = 0

    def finish(self) -> ImportTally:
        """Import what is buffered; a run with a batch past its head at the end of the read has a gap."""
        self.flush()
        for run_id, (first, last) in self._beyond.items():
            if run_id in self.tally.diverged:
                continue
            head = self._head(run_id)
            if last > head:
                self.tally.diverged[run_id] = f"changelog gap: batch starts at seq {first}, log is at {head}"
        self._beyond.clear()
        return self.tally


async def read_to_end(consumer: AIOKafkaConsumer, starts: dict[TopicPartition, int],
                      on_record: Callable[[object], None], idle_timeout: float = 30.0) -> dict[TopicPartition, int]:
    """Read each partition from its start offset up to its end offset as of now; returns next offsets."""
    tps = list(starts)
    if not tps:
        return {}
    ends = await consumer.end_offsets(tps)
    todo = {tp for tp in tps if ends[tp] > starts[tp]}
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, starts[tp])
    positions = dict(starts)
    loop = asyncio.get_running_loop()
    last_progress = loop.time()
    while todo:
        batches = await consumer.getmany(*todo, timeout_ms=500, max_records=5000)
        if batches:
            last_progress = loop.time()
        elif loop.time() - last_progress > idle_timeout:
            raise TimeoutError(f"changelog read stalled at {positions} (ends {ends})")
        for tp, records in batches.items():
            for rec in records:
                on_record(rec)
            if records:
                positions[tp] = records[-1].offset + 1
        for tp in list(todo):
            if positions[tp] >= ends[tp] or await consumer.position(tp) >= ends[tp]:
                positions[tp] = max(positions[tp], ends[tp])
                todo.discard(tp)
    return positions


def changelog_consumer(bootstrap: str, client_id: str = "grandrounds-changelog") -> AIOKafkaConsumer:
    """A group-less consumer for reading changelog partitions by hand."""
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id, group_id=None,
                            enable_auto_commit=False, auto_offset_reset="earliest",
                            max_partition_fetch_bytes=8 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)


async def import_partitions(consumer: AIOKafkaConsumer, topic: str, starts: dict[int, int], store: EventStore,
                            runs: Callable[[str], bool] | None = None) -> ImportTally:
    importer = ChangelogImporter(store, runs)
    ends = await read_to_end(consumer, {TopicPartition(topic, p): o for p, o in starts.items()},
                             lambda rec: importer.add(rec.headers, rec.value))
    importer.finish()
    importer.tally.next_offsets = {tp.partition: o for tp, o in ends.items()}
    return importer.tally
