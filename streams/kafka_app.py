"""The FastStream Kafka app: one subscriber per stage topic, the publishers, and their wiring.

Subscribers validate each message against its pydantic model (FastStream does it from the
handler's annotation) and pass it to the `KafkaWorker`; a message that fails validation is
sent to the dead-letter topic with the error by `DeadLetterMiddleware`, and the worker goes
on. Acknowledgement is manual (`AckPolicy.MANUAL`): offsets are committed by the worker,
per partition, only up to the first message not yet processed.

The same definitions generate the AsyncAPI document (`grandrounds asyncapi`).
"""

import asyncio
import gc
import json
import logging
import os
import socket
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from faststream import FastStream
from faststream.kafka import KafkaBroker
from faststream.kafka.schemas import Topic
from faststream.middlewares import AckPolicy, BaseMiddleware
from pydantic import ValidationError

from grandrounds.handlers.stages import STAGE_TABLE, STAGES, StageDef
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.errors import InvalidInput
from grandrounds.store.eventstore import EventStore
from grandrounds.store.sealing import shared_codec
from grandrounds.store.signing import SigningKey
from grandrounds.streams.assignor import copartition_assignor
from grandrounds.streams.changelog import encode_batch
from grandrounds.streams.kafka_worker import KafkaWorker
from grandrounds.streams.messages import ChangelogBatch, DeadLetter, RetrieveCommand, StageCommand
from grandrounds.streams.session import open_store
from grandrounds.streams.topics import (DEFAULT_GROUP, DEFAULT_PARTITIONS, DEFAULT_PREFIX, Topics, ensure_topics,
                                        partition_for)

log = logging.getLogger("grandrounds.kafka")
# FastStream's own loggers print to stdout; ours go wherever logging is configured (the CLI:
# stderr), so `--json` keeps stdout to one object.
FASTSTREAM_LOG = logging.getLogger("grandrounds.faststream")

COMMAND_FETCH = {"fetch_min_bytes": 64 * 1024, "fetch_max_wait_ms": 100}
"""Fetch settings of the consumers of every stage but the intake (act…govern). Their messages are the
worker's own commands, which it takes up as soon as it has produced them (see `RunActor`); the consumer's
copies only move its position, so it fetches them in batches (at most every 100 ms) instead of
one fetch round trip per command. A command the worker did not produce (another worker's,
after a rebalance) waits at most that long."""

STEP_BATCH_BYTES = 256 * 1024
"""Per-partition batch limit of the per-step producer (aiokafka's default: 16 KiB). A run takes up
its next stage before the broker acknowledges the last, so its changelog batches queue up while
a produce request is out; at 16 KiB the queue filled after a few steps and `send` waited for the
round trip. Below the broker's 1 MiB message limit."""


@dataclass
class WorkerSettings:
    bootstrap: str
    db: str = "grandrounds.duckdb"
    group_id: str = DEFAULT_GROUP
    name: str | None = None
    """Stable worker name: enables static group membership, so a restarted worker gets its
    partitions back at once instead of after the session timeout. One name per running worker."""
    prefix: str = DEFAULT_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    """Partitions of topics this worker creates (existing topics keep theirs)."""
    replication_factor: int | None = None
    max_poll_interval_ms: int = 300_000
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    checkpoint_every: int = 250
    keep_step_log: bool = False
    backbone_opts: dict = field(default_factory=dict)
    """`make_backbone` options of every run's backbone: an endpoint (`base_url`), `agent` (`--agent`'s callable)."""
    agent_name: str | None = None
    """`--agent`: the name its replies are recorded under; the worker takes `agent` runs of that model only."""
    tune_gc: bool = False
    """After start-up, freeze what it loaded out of the garbage collector's way and collect less
    often (the `grandrounds worker` process; not a process that hosts other work, like tests)."""
    signing_key: SigningKey | None = None
    """Sign the head of every run the worker completes (store/signing.py), as `grandrounds run` does."""
    preload_embedder: bool = False
    """Load the embedding model during start-up, before the consumers join the group (the
    `grandrounds worker` process). Loaded lazily instead, a cold load (seconds to tens of seconds)
    blocks the event loop inside the first case, past the heartbeat: the group rebalances."""


def worker_id_for(name: str | None) -> str:
    # Identity of a process in the group, never part of any payload.
    return name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"  # determinism-ok: consumer name, never in a payload


class _ForwardingListener:
    """Rebalance callbacks of one stage's consumer, forwarded to the worker once it exists."""

    def __init__(self, owner: "KafkaWorkerApp", stage: str):
        self.owner = owner
        self.stage = stage

    def _consumer(self) -> AIOKafkaConsumer | None:
        return self.owner.subscribers[self.stage].consumer

    async def on_partitions_revoked(self, revoked):
        if self.owner.worker is not None:
            await self.owner.worker.on_revoked(self.stage, self._consumer(), set(revoked))

    async def on_partitions_assigned(self, assigned):
        if self.owner.worker is not None:
            consumer = self._consumer()
            self.owner.worker.attach(self.stage, consumer)
            await self.owner.worker.on_assigned(self.stage, consumer, set(assigned))


def _dead_letter_middleware(owner: "KafkaWorkerApp") -> type[BaseMiddleware]:
    class DeadLetterMiddleware(BaseMiddleware):
        """Any message whose body does not validate goes to the dead-letter topic with the error."""

        async def consume_scope(self, call_next, msg):
            token = _RECORD.set(msg.raw_message)
            try:
                return await call_next(msg)
            except (ValidationError, json.JSONDecodeError, UnicodeDecodeError, InvalidInput) as exc:
                # What is wrong with the message itself. Not any ValueError: a project error that
                # is a ValueError for compatibility (store/errors.py) may well be the worker's.
                reason, error = "invalid", str(exc)
            except Exception as exc:  # noqa: BLE001 - never let one message stop the worker
                log.exception("unexpected error handling %s", msg.raw_message)
                reason, error = "failed", repr(exc)
            finally:
                _RECORD.reset(token)
            worker = owner.worker
            if worker is not None and isinstance(msg.raw_message, object) and hasattr(msg.raw_message, "topic"):
                await worker.dead_letter(reason, error, msg.raw_message)
            return None

    return DeadLetterMiddleware


class _Broker(KafkaBroker):
    """Starts its subscribers together rather than one after another.

    aiokafka's consumer start waits for the consumer's first assignment, so FastStream's
    sequential start makes the five consumers join the group one by one, each join a
    rebalance of the ones before. Joining together, they settle in one or two rebalances.
    """

    async def start(self) -> None:
        await self.connect()
        await asyncio.gather(*(sub.start() for sub in self.subscribers))
        for pub in self.publishers:
            await pub.start()
        self.running = True


def build_broker(bootstrap: str, topics: Topics, *, owner: "KafkaWorkerApp | None" = None,
                 group_id: str = DEFAULT_GROUP, worker_id: str = "spec", name: str | None = None,
                 consumer_opts: dict | None = None) -> tuple[KafkaBroker, dict, dict]:
    """The broker with its five subscribers and its publishers. Returns (broker, subscribers, publishers)."""
    middlewares = [_dead_letter_middleware(owner)] if owner is not None else []
    broker = _Broker(
        bootstrap, acks="all", enable_idempotence=True, client_id=f"grandrounds-{worker_id}",
        middlewares=middlewares, log_level=logging.DEBUG, logger=FASTSTREAM_LOG,
        description="grandrounds: five stage topics keyed by run id, a changelog of every appended event "
                    "batch, and a dead-letter topic. See DESIGN §4.",
    )
    opts = dict(consumer_opts or {})
    assignor = copartition_assignor(worker_id)
    subscribers: dict[str, Any] = {}
    for row in STAGE_TABLE:
        stage = row.name
        listener = _ForwardingListener(owner, stage) if owner is not None else None
        extra = {} if row.intake else dict(COMMAND_FETCH)
        sub = broker.subscriber(
            Topic(topics.stage(stage), declare=False),
            group_id=group_id,
            group_instance_id=f"{name}.{stage}" if name else None,
            ack_policy=AckPolicy.MANUAL,
            auto_offset_reset="earliest",
            listener=listener,
            partition_assignment_strategy=(assignor,),
            title=f"{topics.stage(stage)}:{stage}",
            description=row.doc,
            **opts, **extra,
        )
        subscribers[stage] = sub
    _register_handlers(subscribers, owner)

    publishers = {
        row.name: broker.publisher(
            Topic(topics.stage(row.name), declare=False), title=f"{topics.stage(row.name)}:publish",
            schema=command_schema(row),
            description=("Produced by `grandrounds submit`: one RunStart, then the cases in order, keyed by run id."
                         if row.intake else
                         f"Produced by the worker once the previous stage's events are committed: run {row.name}."),
        )
        for row in STAGE_TABLE
    }
    publishers["changelog"] = broker.publisher(
        Topic(topics.changelog, declare=False), title=f"{topics.changelog}:publish", schema=ChangelogBatch,
        description="Every appended batch of events (one stage's), one message per batch, keyed by run id; "
                    "headers run_id, first_seq, last_seq. Retention: forever.",
    )
    publishers["dead_letter"] = broker.publisher(
        Topic(topics.dead_letter, declare=False), title=f"{topics.dead_letter}:publish", schema=DeadLetter,
        description="Messages that failed validation (invalid), were refused (rejected) or whose stage "
                    "failed (failed), with the error; keyed like the original.",
    )
    return broker, subscribers, publishers


_RECORD: ContextVar[Any] = ContextVar("grandrounds_kafka_record")
"""The aiokafka record being handled, set by the dead-letter middleware around each handler call.
The handlers read it here rather than taking a `KafkaMessage` argument: FastStream resolves
that argument with a synchronous context lookup, which fast_depends runs on a thread pool —
a thread hop per message that cost more than the rest of FastStream's handling."""


def command_schema(row: StageDef) -> type:
    """The message model of a stage's topic: the intake carries a run's RunStart and cases, every other
    stage the worker's own `StageCommand`."""
    return RetrieveCommand if row.intake else StageCommand


def _register_handlers(subscribers: dict, owner: "KafkaWorkerApp | None") -> None:
    for row in STAGE_TABLE:
        subscribers[row.name](_stage_handler(row.name, command_schema(row), owner))


def _stage_handler(stage: str, schema: type, owner: "KafkaWorkerApp | None"):
    """The subscriber's handler of one stage topic. FastStream validates each body against the handler's
    annotation, so it is the stage's message model (bound here: this module does not postpone annotations)."""
    async def handle(body: schema) -> None:  # type: ignore[valid-type]
        if owner is not None and owner.worker is not None:
            await owner.worker.accept(stage, body, _RECORD.get())

    handle.__name__ = handle.__qualname__ = stage
    return handle


class KafkaWorkerApp:
    """`grandrounds worker`: the FastStream app around a `KafkaWorker` and its DuckDB file."""

    def __init__(self, settings: WorkerSettings, store: EventStore | None = None,
                 cache: EmbeddingCache | None = None):
        self.settings = settings
        self.topics = Topics(settings.prefix)
        self.worker_id = worker_id_for(settings.name)
        self.worker: KafkaWorker | None = None
        self._store, self._cache = store, cache
        self._owns_store = store is None
        self._producer: AIOKafkaProducer | None = None
        self._partitions = settings.partitions
        self._run_partitions: dict[str, int] = {}
        consumer_opts = {
            "max_poll_interval_ms": settings.max_poll_interval_ms,
            "session_timeout_ms": settings.session_timeout_ms,
            "heartbeat_interval_ms": settings.heartbeat_interval_ms,
            "rebalance_timeout_ms": max(settings.session_timeout_ms, 30_000),
        }
        self.broker, self.subscribers, self.publishers = build_broker(
            settings.bootstrap, self.topics, owner=self, group_id=settings.group_id, worker_id=self.worker_id,
            name=settings.name, consumer_opts=consumer_opts)
        self.app = FastStream(self.broker, logger=FASTSTREAM_LOG, on_startup=[self._startup],
                              on_shutdown=[self._shutdown], after_shutdown=[self._closed])

    @property
    def store(self) -> EventStore:
        assert self._store is not None
        return self._store

    async def _startup(self) -> None:
        s = self.settings
        if self._store is None:
            # Sealed only with a key file every worker of the group shares (GRANDROUNDS_KEYS): a run that
            # moves to another worker must open there (README, "Patient data"). The store and embedder
            # every session opens on (streams/session.py); each run is a Session over them (RunActor).
            self._store, cache = open_store(s.db, codec=shared_codec())
            if self._cache is None:
                self._cache = cache
        elif self._cache is None:
            self._cache = EmbeddingCache(shared_minilm(), self._store.conn)
        # on_startup hooks run before FastStream starts the subscribers: the group is joined later.
        if s.preload_embedder and hasattr(self._cache.embedder, "load"):
            await asyncio.to_thread(self._cache.embedder.load)
        partitions = await ensure_topics(s.bootstrap, self.topics, s.partitions, s.replication_factor)
        # The per-step produce (changelog batch + next command) goes through aiokafka directly: the
        # FastStream publishers stay the documented channels, but their per-message encoding and
        # middleware cost as much as the produce itself, twice a step. Same settings as theirs.
        self._producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap, acks="all", enable_idempotence=True,
                                          client_id=f"grandrounds-{self.worker_id}-steps",
                                          max_batch_size=STEP_BATCH_BYTES)
        self._partitions = partitions
        await self._producer.start()
        worker = KafkaWorker(self._store, self._cache, bootstrap=s.bootstrap, topics=self.topics,
                             group_id=s.group_id, worker_id=self.worker_id, partitions=partitions,
                             checkpoint_every=s.checkpoint_every, keep_step_log=s.keep_step_log,
                             backbone_opts=s.backbone_opts, signing_key=s.signing_key, agent_name=s.agent_name)
        worker.publish_stage = self._publish_stage
        worker.publish_changelog = self._publish_changelog
        worker.publish_dead_letter = self._publish_dead_letter
        worker.start()
        self.worker = worker
        log.info("worker %s: group %s, %d partitions, db %s", self.worker_id, s.group_id, partitions, s.db)
        # What start-up loaded (the embedding model, the libraries) lives as long as the process: move
        # it out of the collector's way, and collect the young generation less often. With the
        # defaults, 8 runs of 78 cases cost ~200 collections (one full, 64 ms, rescanning that heap):
        # 0.17 s of GC; alternated, worker CPU per case 2.34–2.6 ms with this against 2.44–2.9.
        if s.tune_gc:
            gc.collect()
            gc.freeze()
            gc.set_threshold(20_000, 10, 10)

    async def _shutdown(self) -> None:
        if self.worker is not None:
            await self.worker.quiesce()

    async def _closed(self) -> None:
        if self.worker is not None:
            await self.worker.close()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store = None

    async def _publish_stage(self, stage: str, cmd: StageCommand, confirm: bool = True):
        """Produce a stage command; with confirm=False, return the future of its acknowledgement."""
        sent = await self._producer.send(self.topics.stage(stage), cmd.model_dump_json().encode("utf-8"),
                                         key=cmd.run_id.encode(), partition=self._partition(cmd.run_id),
                                         headers=[("content-type", b"application/json")])
        if confirm:
            await sent
            return None
        return sent

    async def _publish_changelog(self, stored, confirm: bool = True):
        """Produce a batch to the changelog; with confirm=False, return the future of its acknowledgement."""
        value, headers = encode_batch(stored)
        run_id = stored[0].run_id
        sent = await self._producer.send(self.topics.changelog, value, key=run_id.encode(),
                                         partition=self._partition(run_id), headers=headers)
        if confirm:
            await sent
            return None
        return sent

    def _partition(self, run_id: str) -> int:
        """The run's partition (what the default partitioner gives its key), computed once per run:
        aiokafka's murmur2 is pure Python, and it ran twice a step."""
        p = self._run_partitions.get(run_id)
        if p is None:
            p = self._run_partitions[run_id] = partition_for(run_id, self._partitions)
        return p

    async def _publish_dead_letter(self, letter: DeadLetter, key: bytes | None) -> None:
        await self.publishers["dead_letter"].publish(letter, key=key)

    # --- lifecycle (tests and the CLI) --------------------------------------------------------

    async def start(self) -> None:
        await self.app.start()

    async def stop(self) -> None:
        await self.app.stop()

    async def run(self) -> None:
        await self.app.run(log_level=logging.INFO)


def asyncapi_document(fmt: str = "json", version: str = "0.1.0") -> str:
    """The AsyncAPI document of the app's topics, generated by FastStream."""
    from faststream.specification import AsyncAPI

    broker, _, _ = build_broker("localhost:9092", Topics(DEFAULT_PREFIX))
    spec = AsyncAPI(broker, title="grandrounds", version=version, schema_version="3.0.0",
                    description=f"Streaming cases through {' → '.join(STAGES)} over "
                                "Apache Kafka. Every message is keyed by run id; stage and changelog topics "
                                "are co-partitioned.").to_specification()
    # FastStream lists channels in set order (varies per process): sort keys so the committed
    # document only changes when the topics or message models do.
    doc = json.loads(spec.to_json())
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(doc, sort_keys=True, allow_unicode=True)
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
