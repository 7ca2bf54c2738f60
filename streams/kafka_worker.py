"""The consumer-group worker behind the FastStream app: exactly-once effect on at-least-once delivery.

Subscribers hand every message to `KafkaWorker.accept` and return at once, so each consumer
keeps polling (and its group membership) however long a stage takes — an LLM call can
outlast `max_poll_interval_ms`. The work itself runs in one task per run (`RunActor`), which
keeps the run strictly in order: a message is processed only when it is the run's next step
by the log; an earlier one is a redelivery and is skipped; a later one waits its turn.

Per stage message: the stage runs through `handlers.pipeline.process_case` (stopped at the
stage boundary); its batch of events goes to the changelog; then the events and the consumed
(topic, partition, offset) are appended in one DuckDB transaction; the next stage's command
is produced; only then is the message marked done (and, later, committed to Kafka). So a
crash leaves one of: nothing (the message comes back and the stage runs again); the batch in
the changelog only (the restore imports it, the message comes back and is skipped); or the
stage committed (the message comes back and is skipped). What a crash can lose — the next
stage's command — is re-produced from the log when a worker takes the partition ("kick").

On assignment of partition p: import from changelog partition p the events this DuckDB
file lacks, re-produce lost commands, and resume each topic at the offset stored in DuckDB
(where the file has none: the group's committed offset, else the beginning).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from handlers.cases import Case
from handlers.pipeline import STAGES, CaseProgress, case_progress, process_case
from handlers.runs import RunMismatch, open_run, read_spec
from store.embeddings import EmbeddingCache
from store.event_types import CaseReceived, ReflectionRecorded
from store.eventstore import ConsumedOffset, EventStore
from store.events import NewEvent, StoredEvent
from store.projection import save_checkpoint
from streams.changelog import changelog_consumer, import_partitions
from streams.messages import CaseMessage, DeadLetter, RunStart, StageCommand
from streams.offsets import PartitionOffsets
from streams.topics import Topics, partition_for

log = logging.getLogger("grandrounds.kafka")

STAGE_INDEX = {s: i for i, s in enumerate(STAGES)}
START_KEY = (-1, 0)

# In memory only, never emitted: marks "reflect ran and wrote nothing" (a policy that does not
# write memory), so process_case moves on to govern instead of reflecting again.
_NO_REFLECTION = ReflectionRecorded(summary="", guideline="")


class _StageBoundary(Exception):
    pass


async def _stop_at_boundary(stage: str) -> None:
    raise _StageBoundary(stage)


async def run_one_stage(ctx, case: Case, index: int, progress: CaseProgress) -> str:
    """Run the first stage of the case that `progress` lacks, and only that one.

    process_case is the embedded runner's own sequence of stages, so both transports emit
    the same events in the same order; a Kafka message is one stage, hence the stop.
    """
    try:
        await process_case(ctx, case, index, progress, on_stage=_stop_at_boundary)
    except _StageBoundary as boundary:
        stage = boundary.args[0]
        if stage == "reflect" and progress.reflection is None:
            progress.reflection = _NO_REFLECTION
        return stage
    raise RuntimeError(f"case {case.case_id} was already complete")


@dataclass
class Delivery:
    stage: str
    body: Any
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    received: float
    key: tuple[int, int]


@dataclass
class WorkerStats:
    processed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    skipped: int = 0
    dead_letters: int = 0
    failed: int = 0
    runs_opened: int = 0
    cases_completed: int = 0
    restored_events: int = 0
    kicks: int = 0
    assignments: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    revocations: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    service_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    """Per stage: processing time (stage + DuckDB commit + changelog and next-command acks)."""
    hop_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    """Per stage: from the command's produce timestamp to the start of its processing."""
    step_log: list[tuple[str, int, str]] = field(default_factory=list)
    """(run, case index, stage) of every stage executed, in order (tests check for repeats)."""
    restore_seconds: list[float] = field(default_factory=list)

    def latency(self) -> dict:
        """Per stage: service and hop time percentiles (ms)."""
        def pct(xs: list[float], q: float) -> float | None:
            if not xs:
                return None
            ys = sorted(xs)
            return round(ys[min(len(ys) - 1, int(q * len(ys)))], 2)

        return {stage: {"n": len(self.service_ms.get(stage, [])),
                        "service_p50": pct(self.service_ms.get(stage, []), 0.50),
                        "service_p99": pct(self.service_ms.get(stage, []), 0.99),
                        "hop_p50": pct(self.hop_ms.get(stage, []), 0.50),
                        "hop_p99": pct(self.hop_ms.get(stage, []), 0.99)}
                for stage in STAGES}

    def as_dict(self) -> dict:
        return {
            "processed": dict(self.processed), "skipped_redeliveries": self.skipped,
            "dead_letters": self.dead_letters, "failed": self.failed, "runs_opened": self.runs_opened,
            "cases_completed": self.cases_completed, "restored_events": self.restored_events,
            "kicks": self.kicks, "assignments": dict(self.assignments), "revocations": dict(self.revocations),
            "restore_seconds": [round(x, 3) for x in self.restore_seconds],
            "latency_ms": self.latency(),
            "peak_rss_mb": _peak_rss_mb(),
        }


def _peak_rss_mb() -> float | None:
    # VmHWM, not ru_maxrss: a process spawned by a large parent inherits the parent's ru_maxrss.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


Publish = Callable[..., Awaitable[Any]]


class GroupCommit:
    """Commits the stage batches of several runs together, in one DuckDB transaction.

    Each run's step still commits its events with its consumed offset atomically; several
    runs' steps just share one transaction (one INSERT, one COMMIT), which is most of a step's
    cost here. A batch waits for the others only while steps are known to be on their way (their
    changelog acks outstanding), and never longer than `linger` seconds; a lone step commits at
    once, through the plain `EventWriter.flush` path.
    """

    def __init__(self, worker: "KafkaWorker", linger: float = 0.004):
        self.worker = worker
        self.linger = linger
        self._queue: list[tuple[Any, Delivery, asyncio.Future]] = []  # (EventWriter, delivery, result)
        self._handle: asyncio.Handle | None = None
        self._lingering = False
        self._deadline = 0.0
        self._incoming = 0
        self.transactions = 0
        self.batches = 0

    def expect(self) -> None:
        """A step's changelog batch is on its way; its commit will follow the ack."""
        self._incoming += 1

    def arrived(self) -> None:
        self._incoming -= 1

    def submit(self, writer, d: Delivery) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self._queue:
            self._deadline = loop.time() + self.linger
        self._queue.append((writer, d, fut))
        if self._handle is None or (self._lingering and self._incoming <= 0):
            if self._handle is not None:
                self._handle.cancel()
            self._lingering = False
            self._handle = loop.call_soon(self._run)
        return fut

    def _run(self) -> None:
        self._handle = None
        self._lingering = False
        if not self._queue:
            return
        loop = asyncio.get_running_loop()
        wait = self._deadline - loop.time()
        if self._incoming > 0 and wait > 0:
            self._lingering = True
            self._handle = loop.call_later(wait, self._run)
            return
        items, self._queue = self._queue, []
        self.transactions += 1
        self.batches += len(items)
        if len(items) > 1:
            try:
                results = self._commit_together(items)
            except Exception:  # noqa: BLE001 - commit them one by one so one bad batch fails alone
                log.warning("group commit of %d batches failed; committing them one by one", len(items),
                            exc_info=True)
            else:
                for (_, _, fut), stored in zip(items, results):
                    if not fut.done():
                        fut.set_result(stored)
                return
        for writer, d, fut in items:
            try:
                stored = writer.flush(consumed=self.worker.consumed(d))
            except Exception as exc:  # noqa: BLE001 - handed to the step that owns it
                if not fut.done():
                    fut.set_exception(exc)
            else:
                if not fut.done():
                    fut.set_result(stored)

    def _commit_together(self, items) -> list[list[StoredEvent]]:
        w = self.worker
        by_tp: dict[tuple[str, int], set[int]] = defaultdict(set)
        for _, d, _ in items:
            by_tp[(d.topic, d.partition)].add(d.offset)
        consumed = []
        for (topic, partition), offs in by_tp.items():
            tracker = w.offsets.get((topic, partition))
            nxt = tracker.watermark(assuming_done=offs) if tracker is not None else max(offs) + 1
            consumed.append(ConsumedOffset(w.group_id, topic, partition, nxt))
        writers = [writer for writer, _, _ in items]
        results = w.store.append_many([(wr.run_id, wr.pending, wr.committed_seq) for wr in writers], consumed)
        for wr, stored in zip(writers, results):
            # What EventWriter.flush does after its own append.
            wr.pending = []
            if stored:
                wr.committed_seq = stored[-1].seq
                wr.projection.last_chain = stored[-1].chain
        return results


class KafkaWorker:
    def __init__(self, store: EventStore, cache: EmbeddingCache, *, bootstrap: str, topics: Topics,
                 group_id: str, worker_id: str, partitions: int, checkpoint_every: int = 250,
                 max_buffered: int = 10_000, revoke_timeout: float = 30.0, keep_step_log: bool = False,
                 backbone_opts: dict | None = None):
        self.store = store
        self.cache = cache
        self.bootstrap = bootstrap
        self.topics = topics
        self.group_id = group_id
        self.worker_id = worker_id
        self.partitions = partitions
        self.checkpoint_every = checkpoint_every
        self.max_buffered = max_buffered
        self.revoke_timeout = revoke_timeout
        self.keep_step_log = keep_step_log
        self.backbone_opts = backbone_opts or {}
        self.stats = WorkerStats()
        self.actors: dict[str, RunActor] = {}
        self.offsets: dict[tuple[str, int], PartitionOffsets] = {}
        self.paused: set[tuple[str, int]] = set()
        self.owners: dict[int, set[str]] = defaultdict(set)
        self.takeovers: dict[int, asyncio.Task] = {}
        self.consumers: dict[str, AIOKafkaConsumer] = {}
        self.publish_stage: Publish | None = None  # (stage, StageCommand) -> None
        self.publish_changelog: Publish | None = None  # (list[StoredEvent]) -> None
        self.publish_dead_letter: Publish | None = None  # (DeadLetter, key) -> None
        self.accepting = True
        self._restore_lock = asyncio.Lock()
        self._restorer: AIOKafkaConsumer | None = None
        self._committer: asyncio.Task | None = None
        self.group_commit = GroupCommit(self)

    # --- wiring --------------------------------------------------------------------------

    def attach(self, stage: str, consumer: AIOKafkaConsumer) -> None:
        self.consumers[stage] = consumer

    def start(self) -> None:
        if self._committer is None:
            self._committer = asyncio.create_task(self._commit_loop())

    # --- intake --------------------------------------------------------------------------

    async def accept(self, stage: str, body: Any, record: Any) -> None:
        """A validated message from a stage subscriber. Returns at once; the run's task does the work."""
        tp = (record.topic, record.partition)
        takeover = self.takeovers.get(record.partition)
        if takeover is not None and not takeover.done():
            await asyncio.shield(takeover)  # restore before processing (only right after an assignment)
        tracker = self.offsets.get(tp)
        if not self.accepting or tracker is None:
            return  # fetched before a revoke or shutdown; it will be delivered again
        run_id = body.run_id
        if record.key is None or record.key.decode("utf-8", "replace") != run_id:
            await self.dead_letter("invalid", f"message key {record.key!r} is not its run_id {run_id!r}; "
                                   "messages must be keyed by run id", record)
            return
        if isinstance(body, RunStart):
            key = START_KEY
        elif isinstance(body, CaseMessage):
            key = (body.index, 0)
        else:
            key = (body.index, STAGE_INDEX[stage])
        tracker.delivered(record.offset)
        delivery = Delivery(stage, body, record.topic, record.partition, record.offset,
                            int(record.timestamp or 0), time.monotonic(), key)
        actor = self.actors.get(run_id)
        if actor is None:
            actor = self.actors[run_id] = RunActor(self, run_id, record.partition)
        actor.deliver(delivery)
        if tracker.pending > self.max_buffered and tp not in self.paused:
            consumer = self.consumers.get(stage)
            if consumer is not None:
                consumer.pause(TopicPartition(*tp))
                self.paused.add(tp)

    async def dead_letter(self, reason: str, error: str, record: Any) -> None:
        """Send a message the worker cannot use to the dead-letter topic, then count it consumed."""
        letter = DeadLetter.of(reason, error, record.topic, record.partition, record.offset, record.key, record.value)
        if self.publish_dead_letter is not None:
            await self.publish_dead_letter(letter, record.key)
        self.stats.dead_letters += 1
        log.warning("dead letter (%s) from %s[%d]@%d: %s", reason, record.topic, record.partition,
                    record.offset, error.splitlines()[0] if error else "")
        tracker = self.offsets.get((record.topic, record.partition))
        if tracker is not None:
            tracker.delivered(record.offset)
            self.store.save_offset(ConsumedOffset(self.group_id, record.topic, record.partition,
                                                  tracker.watermark(assuming_done=record.offset)))
            tracker.done(record.offset)

    def finished(self, d: Delivery) -> None:
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

    # --- commits -------------------------------------------------------------------------

    async def _commit_loop(self, every: float = 0.2) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.commit_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failed commit is retried next round
                log.debug("offset commit failed", exc_info=True)

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
                log.debug("commit %s failed: %s", offsets, exc)
                continue
            for tp, mark in offsets.items():
                tracker = self.offsets.get((tp.topic, tp.partition))
                if tracker is not None:
                    tracker.committed = mark
                    tracker.dirty = False

    # --- partitions ----------------------------------------------------------------------

    async def on_assigned(self, stage: str, consumer: AIOKafkaConsumer, assigned: set[TopicPartition]) -> None:
        self.stats.assignments[stage] += 1
        topic = self.topics.stage(stage)
        # Before any await: deliveries of these partitions may start as soon as we yield.
        # Resume from the offsets stored with the events. Where this file has none, the
        # consumer's default applies: the group's committed offset, else the beginning.
        # (No request to the group coordinator here: it would wait on the rebalance that
        # is calling us.)
        stored = self.store.consumer_offsets(self.group_id)
        for tp in assigned:
            start = stored.get((tp.topic, tp.partition))
            if start is not None:
                consumer.seek(tp, start)
            self.offsets[(topic, tp.partition)] = PartitionOffsets(start)
            self.paused.discard((topic, tp.partition))
        parts = sorted(tp.partition for tp in assigned)
        new = [p for p in parts if p not in self.takeovers]
        for p in parts:
            self.owners[p].add(stage)
        if new:
            task = asyncio.create_task(self._take_over(new))
            for p in new:
                self.takeovers[p] = task
        if parts:
            await asyncio.gather(*{asyncio.shield(self.takeovers[p]) for p in parts})
            log.info("%s: assigned %s partitions %s", self.worker_id, stage, parts)

    async def on_revoked(self, stage: str, consumer: AIOKafkaConsumer | None, revoked: set[TopicPartition]) -> None:
        if not revoked:
            return
        self.stats.revocations[stage] += 1
        topic = self.topics.stage(stage)
        parts = {tp.partition for tp in revoked}
        # Let steps in flight on these partitions finish, so no write happens after ownership ends.
        held = await self._quiesce_runs({r for r, a in self.actors.items() if a.partition in parts})
        try:
            await asyncio.wait_for(self.commit_all({(topic, p) for p in parts}), 5.0)
        except Exception:  # noqa: BLE001 - the next owner resumes from what DuckDB or the group has
            log.debug("commit on revoke failed", exc_info=True)
        for p in parts:
            self.offsets.pop((topic, p), None)
            self.paused.discard((topic, p))
            for actor in self.actors.values():
                if actor.partition == p:
                    actor.forget(topic, p)
            self.owners[p].discard(stage)
            if not self.owners[p]:
                self._release(p)
        for actor in held:  # runs whose partition this worker still holds (other stage topics)
            actor.hold = False
            if self.actors.get(actor.run_id) is actor:
                actor.resume()

    def _release(self, p: int) -> None:
        """No consumer of this worker holds p any more: checkpoint and drop its runs."""
        task = self.takeovers.pop(p, None)
        if task is not None and not task.done():
            task.cancel()
        self.owners.pop(p, None)
        for run_id in [r for r, a in self.actors.items() if a.partition == p]:
            self.actors.pop(run_id).close()

    async def _quiesce_runs(self, runs: set[str]) -> list["RunActor"]:
        """Hold these runs after their step in flight; returns them, still held (the caller resumes)."""
        actors = [self.actors[r] for r in runs if r in self.actors]
        for a in actors:
            a.hold = True
        tasks = [a.task for a in actors if a.task is not None and not a.task.done()]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=self.revoke_timeout)
            for t in pending:
                log.warning("a step did not finish within %.0fs of a revoke; cancelling it", self.revoke_timeout)
                t.cancel()
        return actors

    async def _take_over(self, parts: list[int]) -> None:
        """Restore these partitions' runs from the changelog, then re-produce commands a crash lost."""
        t0 = time.monotonic()
        async with self._restore_lock:
            if self._restorer is None:
                self._restorer = changelog_consumer(self.bootstrap, client_id=f"{self.worker_id}-restore")
                await self._restorer.start()
            restore_group = f"{self.group_id}/restore"
            known = self.store.consumer_offsets(restore_group)
            starts = {p: known.get((self.topics.changelog, p), 0) for p in parts}
            tally = await import_partitions(self._restorer, self.topics.changelog, starts, self.store)
            for run_id, n in tally.imported.items():
                self.stats.restored_events += n
                stale = self.actors.get(run_id)
                if stale is not None:
                    stale.reload()  # its projection predates the imported events
                log.info("%s: restored %d events of run %s from the changelog", self.worker_id, n, run_id)
            for run_id, why in tally.diverged.items():
                log.error("%s: run %s cannot be restored from the changelog: %s", self.worker_id, run_id, why)
            if not tally.diverged:
                for p, end in tally.next_offsets.items():
                    if end > starts[p]:
                        self.store.save_offset(ConsumedOffset(restore_group, self.topics.changelog, p, end))
        await self._kick(set(parts))
        self.stats.restore_seconds.append(time.monotonic() - t0)
        log.info("%s: partitions %s ready in %.2fs", self.worker_id, parts, time.monotonic() - t0)

    def schedule_restore(self, p: int) -> None:
        """Re-run partition p's takeover (restore + kick): after a failed local commit."""
        if p in self.owners:
            self.takeovers[p] = asyncio.create_task(self._take_over([p]))  # accept() and the run wait on it

    async def _kick(self, parts: set[int]) -> None:
        """For each run of these partitions with a case in flight, produce its next stage's command again.

        If the command was produced before a crash, this makes a duplicate, which is skipped.
        """
        for info in self.store.runs():
            if partition_for(info.run_id, self.partitions) not in parts:
                continue
            received = self.store.last_of_type(info.run_id, CaseReceived.event_type)
            if received is None:
                continue
            payload = received.decode()
            progress = case_progress(self.store, info.run_id, received.case_id, after_seq=received.seq - 1)
            if progress.completed is not None:
                continue
            nxt = next_stage(progress)
            if nxt == "retrieve" or self.publish_stage is None:
                continue
            await self.publish_stage(nxt, StageCommand(run_id=info.run_id, index=payload.index,
                                                       case_id=received.case_id))
            self.stats.kicks += 1
            log.info("%s: re-produced %s command for run %s case %d", self.worker_id, nxt, info.run_id, payload.index)

    # --- shutdown ------------------------------------------------------------------------

    async def quiesce(self) -> None:
        """Stop taking messages, let steps in flight finish, commit, checkpoint every run."""
        self.accepting = False
        await self._quiesce_runs(set(self.actors))
        try:
            await self.commit_all()
        except Exception:  # noqa: BLE001
            log.debug("final commit failed", exc_info=True)
        if self._committer is not None:
            self._committer.cancel()
            self._committer = None
        for actor in list(self.actors.values()):
            actor.close()
        self.actors.clear()
        self.cache.flush()

    async def close(self) -> None:
        for task in self.takeovers.values():
            task.cancel()
        if self._restorer is not None:
            await self._restorer.stop()
            self._restorer = None

    def summary(self) -> dict:
        return dict(self.stats.as_dict(), embedding_cache_misses=self.cache.misses,
                    commits={"transactions": self.group_commit.transactions, "stage_batches": self.group_commit.batches})


def next_stage(progress: CaseProgress) -> str:
    """The stage process_case would run next for a case with this progress (mirrors its skips)."""
    failed = getattr(progress, "failed", None)  # act/reflect could not complete (case.failed)
    if progress.memory is None:
        return "retrieve"
    if progress.answer is None:
        return "act" if failed is None else "govern"
    if progress.feedback is None:
        return "feedback"
    if progress.reflection is None and failed is None:
        return "reflect"
    return "govern"


class RunActor:
    """One run's mailbox and the task that works through it strictly in order."""

    def __init__(self, worker: KafkaWorker, run_id: str, partition: int):
        self.worker = worker
        self.run_id = run_id
        self.partition = partition
        self.waiting: dict[tuple[int, int], list[Delivery]] = {}
        self.task: asyncio.Task | None = None
        self.hold = False
        self.loaded = False
        self.ctx = None
        self.case: Case | None = None
        self.index: int | None = None
        self.progress = CaseProgress()
        self.expected_cases: int | None = None

    # --- mailbox -------------------------------------------------------------------------

    def deliver(self, d: Delivery) -> None:
        self.waiting.setdefault(d.key, []).append(d)
        self.resume()

    def resume(self) -> None:
        if self.waiting and not self.hold and self.worker.accepting and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self._drain(), name=f"run:{self.run_id}")

    def forget(self, topic: str, partition: int) -> None:
        """Drop waiting deliveries of a revoked topic-partition (they will be delivered again)."""
        for key in list(self.waiting):
            kept = [d for d in self.waiting[key] if (d.topic, d.partition) != (topic, partition)]
            if kept:
                self.waiting[key] = kept
            else:
                del self.waiting[key]

    def close(self, checkpoint: bool = True) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if checkpoint and self.ctx is not None and not self.ctx.writer.pending:
            try:
                save_checkpoint(self.worker.store, self.run_id, self.ctx.projection)
            except Exception:  # noqa: BLE001 - a checkpoint is an optimisation
                log.debug("checkpoint of %s failed", self.run_id, exc_info=True)
        self.ctx = None
        self.loaded = False

    # --- state ---------------------------------------------------------------------------

    def _load(self) -> None:
        """The run as the log has it: projection, and the case in flight with its progress."""
        w = self.worker
        self.ctx, self.case, self.index, self.progress = None, None, None, CaseProgress()
        if w.store.has_run(self.run_id):
            spec = read_spec(w.store, self.run_id)
            self.ctx, _how = open_run(w.store, self.run_id, spec, w.cache, **w.backbone_opts)
            state = self.ctx.projection.state
            if state.cases_received > state.cases_completed:
                received = w.store.last_of_type(self.run_id, CaseReceived.event_type)
                payload = received.decode()
                self.case = Case.model_validate(payload.case)
                self.index = payload.index
                self.progress = case_progress(w.store, self.run_id, self.case.case_id, after_seq=received.seq - 1)
        self.loaded = True

    def next_key(self) -> tuple[int, int]:
        if self.ctx is None:
            return START_KEY
        done = self.ctx.projection.state.cases_completed
        if self.case is None:
            return (done, 0)
        return (self.index, STAGE_INDEX[next_stage(self.progress)])

    # --- the run's task ------------------------------------------------------------------

    async def _drain(self) -> None:
        w = self.worker
        while not self.hold and self.waiting:
            takeover = w.takeovers.get(self.partition)
            if takeover is not None and not takeover.done():
                await asyncio.shield(takeover)  # a restore may be bringing this run's log up to date
                continue
            if not self.loaded:
                try:
                    self._load()
                except Exception as exc:  # noqa: BLE001 - the run cannot be opened at all
                    log.exception("run %s cannot be opened", self.run_id)
                    for key in list(self.waiting):
                        for d in self.waiting.pop(key):
                            await self._fail(d, "failed", f"run cannot be opened: {exc!r}")
                    return
            nxt = self.next_key()
            for key in sorted(k for k in self.waiting if k < nxt):
                for d in self.waiting.pop(key):
                    await self._skip(d)
            ready = self.waiting.get(nxt)
            if not ready:
                return
            d = ready.pop(0)
            if not ready:
                del self.waiting[nxt]
            await self._process(d)

    async def _skip(self, d: Delivery) -> None:
        """A redelivery of a step the log already has: nothing to do but count it consumed."""
        w = self.worker
        if isinstance(d.body, RunStart):
            self.expected_cases = d.body.cases
            recorded = read_spec(w.store, self.run_id)
            if recorded is not None and recorded != d.body.spec:
                await self._fail(d, "rejected", f"run {self.run_id!r} already exists with a different "
                                 "configuration; choose another run id")
                return
        w.stats.skipped += 1
        w.store.save_offset(w.consumed(d))  # so a restart does not deliver it yet again
        w.finished(d)

    async def _fail(self, d: Delivery, reason: str, error: str) -> None:
        w = self.worker
        w.stats.failed += reason == "failed"
        letter = DeadLetter.of(reason, error, d.topic, d.partition, d.offset, self.run_id.encode(),
                               d.body.model_dump_json().encode())
        if w.publish_dead_letter is not None:
            await w.publish_dead_letter(letter, self.run_id.encode())
        w.stats.dead_letters += 1
        log.error("run %s: %s message at %s[%d]@%d %s: %s", self.run_id, d.stage, d.topic, d.partition,
                  d.offset, reason, error)
        w.finished(d)

    async def _process(self, d: Delivery) -> None:
        w = self.worker
        started = time.monotonic()
        if d.timestamp_ms:
            w.stats.hop_ms[d.stage].append(max(0.0, time.time() * 1000 - d.timestamp_ms))  # determinism-ok: stats
        if isinstance(d.body, RunStart):
            await self._open(d)
            return
        if isinstance(d.body, CaseMessage):
            self.case, self.index, self.progress = d.body.case, d.body.index, CaseProgress()
        ctx = self.ctx
        try:
            stage = await run_one_stage(ctx, self.case, self.index, self.progress)
            if stage != d.stage:
                raise RuntimeError(f"the log's next stage is {stage}, the message is for {d.stage}")
            batch = w.store.preview(self.run_id, ctx.writer.pending, ctx.writer.committed_seq)
        except Exception as exc:  # noqa: BLE001 - the stage failed: nothing was written
            log.exception("run %s case %s: %s failed", self.run_id, self.index, d.stage)
            self._reset()  # the projection saw the stage's unwritten events: reopen from the log
            await self._fail(d, "failed", f"{d.stage} of case {self.index} failed: {exc!r}")
            return
        # From here the step must not be cut short by a revoke or shutdown.
        committed = await asyncio.shield(self._commit(d, stage, batch))
        if not committed:
            return
        if w.keep_step_log:
            w.stats.step_log.append((self.run_id, self.index, stage))
        w.stats.processed[stage] += 1
        w.stats.service_ms[stage].append((time.monotonic() - started) * 1000)
        if stage == "govern":
            w.stats.cases_completed += 1
            done = ctx.projection.state.cases_completed
            self.case, self.index, self.progress = None, None, CaseProgress()
            w.cache.flush()
            if (w.checkpoint_every and done % w.checkpoint_every == 0) or done == self.expected_cases:
                save_checkpoint(w.store, self.run_id, ctx.projection)
            if done == self.expected_cases:
                log.info("run %s: all %d cases done", self.run_id, done)

    async def _commit(self, d: Delivery, stage: str, batch: list[StoredEvent]) -> bool:
        """Changelog, then DuckDB (events + consumed offset, one transaction), then the next command.

        The changelog goes first so that it always holds at least what this file holds: a
        crash between the two leaves a batch in the changelog only, which the restore on
        restart imports (and the redelivered message is then skipped as done).
        """
        w = self.worker
        ctx = self.ctx
        logged = None
        if batch and w.publish_changelog is not None:
            logged = await w.publish_changelog(batch, confirm=False)
        # The next command is sent with the changelog batch (one produce request, one round trip)
        # and confirmed after the DuckDB commit. It cannot be processed early: it belongs to this
        # run, whose task is busy with this step; and if a crash loses this step, the command
        # waits in the run's mailbox until the redelivered step has run again (then it is next).
        sent = None
        if stage != "govern" and w.publish_stage is not None:
            sent = await w.publish_stage(next_stage(self.progress), StageCommand(
                run_id=self.run_id, index=self.index, case_id=self.case.case_id), confirm=False)
        if logged is not None:
            w.group_commit.expect()
            try:
                await logged  # the changelog holds the batch before this file does
            finally:
                w.group_commit.arrived()
        try:
            stored = await w.group_commit.submit(ctx.writer, d)
        except Exception as exc:  # noqa: BLE001 - DuckDB refused the transaction
            log.critical("run %s: committing %s of case %s failed after its changelog batch was sent; "
                         "the run is reloaded from the log and restored from the changelog", self.run_id,
                         stage, self.index, exc_info=True)
            self._reset()
            w.schedule_restore(self.partition)
            await self._fail(d, "failed", f"commit of {stage} failed: {exc!r}")
            return False
        if [e.chain for e in stored] != [e.chain for e in batch]:
            log.critical("run %s: committed batch differs from the changelog batch", self.run_id)
        if sent is not None:
            await sent
        w.finished(d)
        return True

    def reload(self) -> None:
        """Forget the in-memory state; the next step reopens the run from the log."""
        self._reset()

    def _reset(self) -> None:
        self.loaded = False
        self.ctx = None
        self.case, self.index, self.progress = None, None, CaseProgress()

    async def _open(self, d: Delivery) -> None:
        w = self.worker
        self.expected_cases = d.body.cases
        spec = d.body.spec
        try:
            # Publish run.started before writing it, as every batch (see _commit).
            started = NewEvent(spec.started_event(w.cache.embedder.name))
            batch = w.store.preview(self.run_id, [started], -1)
        except Exception as exc:  # noqa: BLE001
            await self._fail(d, "failed", f"run cannot be opened: {exc!r}")
            return
        await asyncio.shield(self._commit_open(d, spec, batch))

    async def _commit_open(self, d: Delivery, spec, batch: list[StoredEvent]) -> None:
        w = self.worker
        if w.publish_changelog is not None:
            await w.publish_changelog(batch)
        try:
            self.ctx, _how = open_run(w.store, self.run_id, spec, w.cache, **w.backbone_opts)
        except RunMismatch as exc:
            await self._fail(d, "rejected", str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - e.g. a backbone this worker cannot build
            log.exception("run %s cannot be opened", self.run_id)
            self._reset()
            await self._fail(d, "failed", f"run cannot be opened: {exc!r}")
            return
        w.store.save_offset(w.consumed(d))
        w.stats.runs_opened += 1
        self.case, self.index, self.progress = None, None, CaseProgress()
        log.info("run %s opened (%d cases announced)", self.run_id, d.body.cases)
        w.finished(d)
