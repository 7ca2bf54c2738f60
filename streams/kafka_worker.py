"""The consumer-group worker behind the FastStream app: exactly-once effect on at-least-once delivery.

Subscribers hand every message to `KafkaWorker.accept` and return at once, so each consumer
keeps polling (and its group membership) however long a stage takes — an LLM call can
outlast `max_poll_interval_ms`. The work itself runs in one task per run (`RunActor`), which
keeps the run strictly in order: a message is processed only when it is the run's next step
by the log; an earlier one is a redelivery and is skipped; a later one waits its turn.

Per stage message: the stage the case runs next by `handlers.pipeline.next_stage` runs (`run_stage`,
the one stage machine the embedded runner drives too); its batch of events goes to the changelog and the next stage's command to its
topic (both queued on one producer, in order). Where this worker owns the command's partition,
the run goes on with the next stage at once, without waiting for the broker: that step is
committed only once the command's offset is known (from the produce acknowledgement, or from
the consumer's copy if that comes first; the copy is then recognised and dropped). Elsewhere the
next stage comes from the other worker's consumer, after this step's DuckDB commit. The
`Committer` writes each step's events with its consumed (topic, partition, offset) in one
DuckDB transaction, after the changelog acknowledged the batch; the steps of all runs that are
ready share a transaction, on a thread of its own, and a run does not wait for it. Only then is
the message marked done (and, later, committed to Kafka). So the file is always a prefix of the
changelog, and a crash leaves one of: nothing of a step (the message comes back and the stage
runs again); its batch in the changelog only (the restore imports it, the message comes back and
is skipped); or the step committed (the message comes back and is skipped). What a crash can
lose — the next stage's command — is re-produced from the log when a worker takes the partition
("kick"). A batch or command the broker refuses fails the run's uncommitted steps: the run is
reloaded from the file, restored from the changelog and kicked; a later batch of the run that
landed past the refused one is skipped by every reader (`ChangelogImporter`) until the steps
come again in order.

On assignment of partition p: import from changelog partition p the events this DuckDB
file lacks, re-produce lost commands, and resume each topic at the offset stored in DuckDB
(where the file has none: the group's committed offset, else the beginning).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition

from grandrounds.handlers.cases import Case
from grandrounds.handlers.pipeline import STAGES, CaseProgress, case_progress, next_stage, run_stage
from grandrounds.handlers.runs import RunMismatch, open_run, read_spec, spec_difference
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.event_types import CaseReceived
from grandrounds.store.eventstore import ConsumedOffset, EventStore
from grandrounds.store.events import NewEvent, StoredEvent
from grandrounds.store.projection import Checkpoint, checkpoint_of, save_checkpoint, write_checkpoint
from grandrounds.streams.changelog import changelog_consumer, import_partitions
from grandrounds.streams.latency import LatencyHistogram
from grandrounds.streams.messages import CaseMessage, DeadLetter, RunStart, StageCommand
from grandrounds.streams.offsets import PartitionOffsets
from grandrounds.streams.topics import Topics, partition_for

log = logging.getLogger("grandrounds.kafka")

STAGE_INDEX = {s: i for i, s in enumerate(STAGES)}
START_KEY = (-1, 0)

async def run_one_stage(ctx, case: Case, index: int, progress: CaseProgress) -> str:
    """Run the stage the case runs next (handlers/pipeline.py's stage machine), and only that one:
    a Kafka message is one stage."""
    stage = next_stage(progress)
    if stage is None:
        raise RuntimeError(f"case {case.case_id} was already complete")
    await run_stage(ctx, case, index, progress, stage)
    return stage


@dataclass
class Delivery:
    stage: str
    body: Any
    topic: str
    partition: int
    offset: int | None
    """None: an own delivery whose offset is not known yet (its produce is not acknowledged)."""
    timestamp_ms: int
    received: float
    key: tuple[int, int]
    own: bool = False
    """Delivered by this worker to itself, ahead of the broker's acknowledgement of its produce."""
    lost: BaseException | None = None
    """An own delivery whose command the broker did not take: its step cannot be committed."""
    sent: asyncio.Future | None = None
    """An own delivery: the produce acknowledgement of its command."""


@dataclass
class WorkerStats:
    processed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    skipped: int = 0
    own_deliveries: int = 0
    """Stage commands this worker took up as soon as it produced them (it owns their partition)."""
    echoes: int = 0
    """The consumer's copies of those commands, recognised and dropped."""
    early_copies: int = 0
    """Of the echoes: copies fetched before the produce ack came back (matched by step, not offset)."""
    dead_letters: int = 0
    failed: int = 0
    commit_failures: int = 0
    """Steps whose DuckDB commit or changelog batch was refused: their run was reloaded, restored
    and took them up again (nothing wrong with the messages, so no dead letter)."""
    runs_opened: int = 0
    cases_completed: int = 0
    restored_events: int = 0
    kicks: int = 0
    assignments: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    revocations: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    service_ms: dict[str, LatencyHistogram] = field(default_factory=lambda: defaultdict(LatencyHistogram))
    """Per stage: from the start of processing to the DuckDB commit (the stage, the changelog ack, and
    the grouped commit, which the run itself does not wait for)."""
    hop_ms: dict[str, LatencyHistogram] = field(default_factory=lambda: defaultdict(LatencyHistogram))
    """Per stage: from the command's produce timestamp to the start of its processing (for a command
    delivered on its produce ack: that round trip)."""
    step_log: list[tuple[str, int, str]] = field(default_factory=list)
    """(run, case index, stage) of every stage executed, in order (tests check for repeats)."""
    restore_seconds: deque = field(default_factory=lambda: deque(maxlen=64))
    """The last 64 takeovers' restore times (s)."""

    def latency(self) -> dict:
        """Per stage: service and hop time percentiles (ms), from bounded histograms (within 5 %)."""
        empty = LatencyHistogram()

        def pct(h: LatencyHistogram, q: float) -> float | None:
            v = h.quantile(q)
            return None if v is None else round(v, 2)

        return {stage: {"n": len(self.service_ms.get(stage, empty)),
                        "service_p50": pct(self.service_ms.get(stage, empty), 0.50),
                        "service_p99": pct(self.service_ms.get(stage, empty), 0.99),
                        "hop_p50": pct(self.hop_ms.get(stage, empty), 0.50),
                        "hop_p99": pct(self.hop_ms.get(stage, empty), 0.99)}
                for stage in STAGES}

    def as_dict(self) -> dict:
        return {
            "processed": dict(self.processed), "skipped_redeliveries": self.skipped,
            "own_deliveries": self.own_deliveries, "echoes": self.echoes, "early_copies": self.early_copies,
            "dead_letters": self.dead_letters, "failed": self.failed, "commit_failures": self.commit_failures,
            "runs_opened": self.runs_opened,
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


@dataclass
class Step:
    """One processed stage message on its way into DuckDB: its batch, the message, the changelog ack."""

    actor: "RunActor"
    d: Delivery
    stage: str
    expected_seq: int
    batch: list[StoredEvent]
    logged: asyncio.Future | None
    """The changelog's acknowledgement of `batch` (None: an empty batch, nothing to log)."""
    started: float
    committed: asyncio.Future
    dropped: bool = False


class Committer:
    """Writes processed steps to DuckDB: each step's events with its consumed offset, in one transaction.

    A run does not wait for its step to reach the file before it goes on to its next step:
    the step's batch is in the changelog already (a step is committed only after the
    changelog acknowledged it), and the file only ever holds a prefix of the changelog. So
    the commits of consecutive steps — of one run, and of all runs — are grouped: one
    transaction (one INSERT, one offsets UPDATE, one COMMIT) for every step ready when it
    starts. The transaction runs on a thread of its own (DuckDB releases the GIL while it
    works), one at a time, at most one starting every `linger` seconds (sooner once
    `max_batch` steps wait); steps that arrive meanwhile go into the next one.

    Steps of a run are committed in order; a step whose changelog ack is outstanding, or whose
    command's offset is not known yet (taken up ahead of its ack), holds back its run's later
    steps. The offset stored for a partition is the position below
    which every message is done (`PartitionOffsets`), so a transaction never stores a
    position past a message whose effect it does not hold.

    Why 25 ms: a DuckDB transaction costs ~2 ms of CPU to commit plus ~1 ms a statement,
    whatever its size, and the worker shares two cores with the broker. At 5 ms the commit
    thread ran ~190 transactions for 624 cases (8 runs); at 25 ms ~90, and the 8-run benchmark
    went from ~140 to ~175 cases/s. Nothing waits on the file in the steady state (only a
    checkpoint, a rebalance, or a next stage owned by another worker), so the linger costs no
    throughput; at 100 ms one run slowed down (its steps backed up to `max_uncommitted`).
    """

    def __init__(self, worker: "KafkaWorker", linger: float = 0.025, max_batch: int = 512,
                 threaded: bool = True):
        self.worker = worker
        self.linger = linger
        self.max_batch = max_batch
        self.queue: list[Step] = []
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._soon = False
        self._inflight: asyncio.Future | None = None
        self._writing: list[Step] = []  # the steps of the transaction in flight
        self._last_start = 0.0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="duckdb-commit") if threaded else None
        self.transactions = 0
        self.batches = 0

    def submit(self, step: Step) -> None:
        self.queue.append(step)
        step.actor.uncommitted += 1
        if step.logged is not None and not step.logged.done():
            step.logged.add_done_callback(lambda _f: self.schedule())
        self.schedule(now=len(self.queue) >= self.max_batch)

    def schedule(self, now: bool = False) -> None:
        """Commit soon: on new steps, changelog acks, and positions to store (skips, dead letters)."""
        if self._inflight is not None:
            return  # the commit in flight schedules the next when it is done
        loop = asyncio.get_running_loop()
        if now and not self._soon:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = loop.call_soon(self._flush)
            self._soon = True
        elif self._handle is None:
            delay = self._last_start + self.linger - loop.time()
            if delay > 0:
                self._handle = loop.call_later(delay, self._flush)
            else:
                self._handle = loop.call_soon(self._flush)
                self._soon = True

    async def settle(self, actors: "Iterable[RunActor] | None" = None) -> None:
        """Commit now, and wait until every step these runs (default: all) handed over so far is in the
        file (or was dropped). Steps handed over meanwhile are not waited for."""
        wanted = None if actors is None else set(actors)
        pending = [s.committed for s in (*self._writing, *self.queue)
                   if (wanted is None or s.actor in wanted) and not s.committed.done()]
        if not pending:
            return
        self.schedule(now=True)
        await asyncio.wait(pending)

    async def store_positions(self, attempts: int = 3) -> None:
        """Write every partition's position now (a clean stop). Skipped redeliveries and dead letters
        move a position with no step to carry it; it goes with the next commit, up to `linger` later,
        and a stop in between would leave it out of the file, so a restart would deliver them again."""
        for _ in range(attempts):
            await self._wait_inflight()
            if not any(t.watermark() > t.stored for t in self.worker.offsets.values()):
                return
            self.schedule(now=True)
            await asyncio.sleep(0)  # the flush starts the transaction (or, unthreaded, runs it)
        await self._wait_inflight()

    async def _wait_inflight(self) -> None:
        if self._inflight is not None:
            await asyncio.wait([self._inflight])
            await asyncio.sleep(0)  # its done-callback applies the outcome

    async def idle(self) -> None:
        """Wait for everything handed over so far: steps in the file, checkpoints written."""
        await self.settle()
        if self._pool is not None:
            await asyncio.get_running_loop().run_in_executor(self._pool, lambda: None)  # one thread: FIFO

    def write_checkpoint(self, run_id: str, checkpoint: Checkpoint | None) -> None:
        """Write a run's projection snapshot on the commit thread (after the transactions queued there).

        Writing it took 5–20 ms of DuckDB; on the event loop that stalled every run the worker
        serves, once per run per `checkpoint_every` cases. A checkpoint is an optimisation: a
        failed write is logged, and the next open rebuilds or catches up from the log.
        """
        def written(fut: asyncio.Future) -> None:
            if not fut.cancelled() and fut.exception() is not None:
                log.warning("checkpoint of %s failed: %r", run_id, fut.exception())

        if self._pool is None:
            try:
                write_checkpoint(self.worker.store, run_id, checkpoint)
            except Exception as exc:  # noqa: BLE001
                log.warning("checkpoint of %s failed: %r", run_id, exc)
            return
        asyncio.get_running_loop().run_in_executor(
            self._pool, write_checkpoint, self.worker.store, run_id, checkpoint).add_done_callback(written)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # the last transactions and checkpoints

    def _flush(self) -> None:
        self._handle = None
        self._soon = False
        if self._inflight is not None:
            return
        ready: list[Step] = []
        rest: list[Step] = []
        failed: list[Step] = []
        held: set[int] = set()
        for step in self.queue:
            key = id(step.actor)
            logged = step.logged
            if key in held or (logged is not None and not logged.done()) or (
                    step.d.offset is None and step.d.lost is None):
                held.add(key)  # a run's steps are committed in order
                rest.append(step)
            elif (logged is not None and (logged.cancelled() or logged.exception() is not None)) or step.d.lost:
                held.add(key)
                rest.append(step)
                failed.append(step)
            else:
                ready.append(step)
        self.queue = rest
        for step in failed:
            if not step.dropped:
                if step.d.lost is not None:
                    exc = step.d.lost
                else:
                    exc = asyncio.CancelledError() if step.logged.cancelled() else step.logged.exception()
                self._fail_run(step.actor, [step], exc)
        positions = self._positions(ready)
        if not ready and not positions:
            return
        # Should the group's transaction fail, each run is committed alone, with only its own positions.
        by_run: dict[int, list[Step]] = {}
        for s in ready:
            by_run.setdefault(id(s.actor), []).append(s)
        apart = []
        if len(by_run) > 1:
            for run_steps in by_run.values():
                mine = {(s.d.topic, s.d.partition) for s in run_steps}
                apart.append((run_steps, [c for c in self._positions(run_steps) if (c.topic, c.partition) in mine]))
        self.transactions += 1
        self.batches += len(ready)
        loop = asyncio.get_running_loop()
        self._last_start = loop.time()
        if self._pool is None:
            self._apply(self._write(ready, positions, apart))
            self._next()
            return
        self._writing = ready
        self._inflight = loop.run_in_executor(self._pool, self._write, ready, positions, apart)
        self._inflight.add_done_callback(lambda fut: self._written(fut, ready, positions))

    def _written(self, fut: asyncio.Future, steps: list[Step], positions: list[ConsumedOffset]) -> None:
        self._inflight = None
        self._writing = []
        try:
            outcomes = fut.result()
        except BaseException as exc:  # noqa: BLE001 - the thread itself failed
            outcomes = [(steps, positions, exc)]
        self._apply(outcomes)
        self._next()

    def _next(self) -> None:
        if self.queue or any(t.watermark() > t.stored for t in self.worker.offsets.values()):
            self.schedule()

    def _write(self, steps: list[Step], positions: list[ConsumedOffset], apart: list) -> list:
        """The transaction (on the commit thread): [(steps, positions, stored batches | the exception)]."""
        store = self.worker.store
        try:
            return [(steps, positions, store.append_prepared(
                [(s.actor.run_id, s.batch, s.expected_seq) for s in steps], positions))]
        except Exception as exc:  # noqa: BLE001 - commit run by run, so one bad run fails alone
            if not apart:
                return [(steps, positions, exc)]
            log.warning("group commit of %d steps failed (%r); committing run by run", len(steps), exc)
        out = []
        for run_steps, run_positions in apart:
            try:
                out.append((run_steps, run_positions, store.append_prepared(
                    [(s.actor.run_id, s.batch, s.expected_seq) for s in run_steps], run_positions)))
            except Exception as exc:  # noqa: BLE001
                out.append((run_steps, run_positions, exc))
        return out

    def _apply(self, outcomes: list) -> None:
        for steps, positions, result in outcomes:
            if isinstance(result, BaseException):
                if steps:
                    self._fail_run(steps[0].actor, steps, result)
                else:
                    log.warning("storing offsets failed (%r); retried with the next commit", result)
                continue
            for c in positions:
                tracker = self.worker.offsets.get((c.topic, c.partition))
                if tracker is not None and c.next_offset > tracker.stored:
                    tracker.stored = c.next_offset
            for step, stored in zip(steps, result):
                self._done(step, stored)

    def _positions(self, steps: list[Step]) -> list[ConsumedOffset]:
        """Offsets to store with these steps: each partition's watermark, as if the steps were done,
        where it moved past what the file holds (theirs, and skipped or dead-lettered messages')."""
        w = self.worker
        by_tp: dict[tuple[str, int], set[int]] = defaultdict(set)
        for s in steps:
            by_tp[(s.d.topic, s.d.partition)].add(s.d.offset)
        out = []
        for tp, tracker in w.offsets.items():
            mark = tracker.watermark(assuming_done=by_tp.get(tp))
            if mark > tracker.stored:
                out.append(ConsumedOffset(w.group_id, tp[0], tp[1], mark))
        return out

    def _done(self, step: Step, stored: list[StoredEvent]) -> None:
        w = self.worker
        actor = step.actor
        if step.dropped:
            return
        w.stats.processed[step.stage] += 1
        w.stats.service_ms[step.stage].add((time.monotonic() - step.started) * 1000)
        if step.stage == "govern":
            w.stats.cases_completed += 1
        w.finished(step.d)
        if not step.committed.done():
            step.committed.set_result(True)
        actor.committed_one()

    def _fail_run(self, actor: "RunActor", steps: list[Step], exc: BaseException) -> None:
        """These steps of a run cannot be committed: drop them and the run's later ones, reload the run
        from the log and restore it from the changelog, and take their messages up again.

        The changelog holds the dropped steps' batches when DuckDB refused the commit (they are then
        skipped as redeliveries); when the changelog refused a batch, the later ones that landed past
        it are skipped by the restore, and the steps run again. Their messages must not count as
        done: a case message, once consumed, comes from no one else. Nor do they go to the dead
        letters: nothing is wrong with them, and a client following the run stops at a dead letter."""
        w = self.worker
        first = steps[0]
        log.critical("run %s: committing %s of case %s failed (%r); the run is reloaded from the log and "
                     "restored from the changelog", actor.run_id, first.stage, first.d.key[0], exc)
        dropped = [s for s in steps if not s.dropped] + [s for s in self.queue if s.actor is actor and s not in steps]
        self.queue = [s for s in self.queue if s.actor is not actor]
        w.stats.commit_failures += 1
        actor.reload()
        w.schedule_restore(actor.partition)
        for s in dropped:
            s.dropped = True
            if not s.committed.done():
                s.committed.set_result(False)
            if s.d.lost is None:  # a refused command is not in Kafka: the kick produces it again
                actor.waiting.setdefault(s.d.key, []).append(s.d)  # after the restore: skipped, or run again
            actor.committed_one()
        actor.resume()


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
        self._group_committer: asyncio.Task | None = None
        self.committer = Committer(self)

    # --- wiring --------------------------------------------------------------------------

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

    def start(self) -> None:
        if self._group_committer is None:
            self._group_committer = asyncio.create_task(self._commit_loop())

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
        if d.offset is None:
            if d.sent is not None and d.lost is None:
                # Taken up ahead of its ack: done once its offset is known (the ack's callback, which
                # sets it, was registered first, so it runs first).
                d.sent.add_done_callback(lambda _f: d.offset is not None and self.finished(d))
            return
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
            log.warning("offset commit on revoke failed", exc_info=True)
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
        # Their processed steps into the file before ownership can end.
        try:
            await asyncio.wait_for(self.committer.settle(actors), self.revoke_timeout)
        except asyncio.TimeoutError:
            log.warning("steps of %s not committed within %.0fs of a revoke", [a.run_id for a in actors],
                        self.revoke_timeout)
        return actors

    async def _take_over(self, parts: list[int]) -> None:
        """Restore these partitions' runs from the changelog, then re-produce commands a crash lost."""
        t0 = time.monotonic()
        # The kick below reads these runs' progress from the file.
        await self.committer.settle([a for a in self.actors.values() if a.partition in parts])
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
        await self.committer.settle()
        await self.committer.store_positions()
        try:
            await self.commit_all()
        except Exception:  # noqa: BLE001
            log.warning("final offset commit failed", exc_info=True)
        if self._group_committer is not None:
            self._group_committer.cancel()
            self._group_committer = None
        for actor in list(self.actors.values()):
            actor.close()
        self.actors.clear()
        self.cache.flush()

    async def close(self) -> None:
        self.committer.close()
        for task in self.takeovers.values():
            task.cancel()
        if self._restorer is not None:
            await self._restorer.stop()
            self._restorer = None

    def summary(self) -> dict:
        return dict(self.stats.as_dict(), embedding_cache_misses=self.cache.misses,
                    commits={"transactions": self.committer.transactions, "stage_batches": self.committer.batches})


class _Reloaded(Exception):
    """The run was reloaded from the log while a stage ran (a commit of an earlier step failed)."""


class RunActor:
    """One run's mailbox and the task that works through it strictly in order.

    Pipelined: a processed step goes to the changelog and to the committer, and the run goes
    on with its next step as soon as that step's command is handed to the producer (where this
    worker owns the command's partition, as the co-partitioned assignment makes it do): it waits
    neither for the broker's acknowledgement, nor for the DuckDB commit of the step before, nor
    for its consumer to fetch the command back (that copy is recognised and dropped). So a run
    keeps the event loop busy while its produce requests are out, instead of waiting a round
    trip per stage. Every committed step still ran off a command that is in Kafka, and is
    committed with that command's offset, after its own changelog batch and every earlier one
    of the run were acknowledged: the file never holds what the changelog lacks.
    """

    max_uncommitted = 64
    """Steps a run may have processed but not yet in the file before it waits for the committer."""

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
        self.head: tuple[int, str] | None = None
        """(seq, chain) of the run's last processed event: in the file, or on its way there."""
        self.generation = 0
        """Bumped whenever the in-memory state is dropped; work begun before belongs to the old state."""
        self.uncommitted = 0
        """Steps handed to the committer and not yet in the file (nor dropped)."""
        self.ahead: dict[tuple[int, int], Delivery] = {}
        """Own deliveries whose command's offset is not known yet, by step key."""

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
        if checkpoint and self.ctx is not None and not self.ctx.writer.pending and not self.uncommitted:
            try:
                save_checkpoint(self.worker.store, self.run_id, self.ctx.projection)
            except Exception:  # noqa: BLE001 - a checkpoint is an optimisation
                log.debug("checkpoint of %s failed", self.run_id, exc_info=True)
        self.ctx = None
        self.loaded = False

    def committed_one(self) -> None:
        """The committer is done with one of this run's steps (in the file, or dropped)."""
        self.uncommitted = max(0, self.uncommitted - 1)

    # --- state ---------------------------------------------------------------------------

    def _load(self) -> None:
        """The run as the log has it: projection, and the case in flight with its progress."""
        w = self.worker
        self.ctx, self.case, self.index, self.progress = None, None, None, CaseProgress()
        if w.store.has_run(self.run_id):
            spec = read_spec(w.store, self.run_id)
            self.ctx, _how = open_run(w.store, self.run_id, spec, w.cache, **w.backbone_opts)
            self.head = w.store.head(self.run_id)
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
        settled = False
        while not self.hold and self.waiting:
            takeover = w.takeovers.get(self.partition)
            if takeover is not None and not takeover.done():
                await asyncio.shield(takeover)  # a restore may be bringing this run's log up to date
                continue
            if not self.loaded:
                if self.uncommitted and not settled:
                    await w.committer.settle([self])  # the file must hold every processed step before it is read
                    settled = True
                    continue
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
            try:
                await self._process(d)
            except asyncio.CancelledError:
                # Cancelled mid-step (a revoke that waited too long): EventWriter.emit already applied the
                # step's events to the projection, so the in-memory state must not outlive them. The
                # message, not marked done, comes again from the broker to whoever owns it.
                self._reset()
                raise
            if self.uncommitted > self.max_uncommitted:
                await w.committer.settle([self])
            elif d.own:
                await asyncio.sleep(0)  # let the other runs, acks and fetches in between

    async def _skip(self, d: Delivery) -> None:
        """A redelivery of a step the log already has: nothing to do but count it consumed."""
        w = self.worker
        if isinstance(d.body, RunStart):
            self.expected_cases = d.body.cases
            recorded = read_spec(w.store, self.run_id)
            if recorded is not None and recorded != d.body.spec:
                asked = d.body.spec.started_event("", d.body.cases)
                first = w.store.read(self.run_id, upto_seq=0)[0].decode()
                await self._fail(d, "rejected", f"run {self.run_id!r} already exists with a different "
                                 f"configuration: {spec_difference(first, asked.model_copy(update={'embedder': first.embedder}))}; "
                                 "choose another run id")
                return
        w.stats.skipped += 1
        w.finished(d)
        w.committer.schedule()  # its position goes to DuckDB with the next commit, so a restart skips it

    async def _fail(self, d: Delivery, reason: str, error: str) -> None:
        w = self.worker
        w.stats.failed += reason == "failed"
        if d.offset is None and d.sent is not None:
            # Taken up ahead of its ack: the letter names the command's offset, and the message is
            # done only once that is known (the ack's callback, registered first, sets it).
            try:
                await asyncio.shield(d.sent)
            except Exception:  # noqa: BLE001 - refused: the command is not in Kafka (offset -1)
                pass
        offset = -1 if d.offset is None else d.offset
        letter = DeadLetter.of(reason, error, d.topic, d.partition, offset, self.run_id.encode(),
                               d.body.model_dump_json().encode())
        if w.publish_dead_letter is not None:
            await w.publish_dead_letter(letter, self.run_id.encode())
        w.stats.dead_letters += 1
        log.error("run %s: %s message at %s[%d]@%d %s: %s", self.run_id, d.stage, d.topic, d.partition,
                  offset, reason, error)
        w.finished(d)
        w.committer.schedule()

    async def _process(self, d: Delivery) -> None:
        w = self.worker
        started = time.monotonic()
        if d.own:
            w.stats.hop_ms[d.stage].add((started - d.received) * 1000)
        elif d.timestamp_ms:
            w.stats.hop_ms[d.stage].add(max(0.0, time.time() * 1000 - d.timestamp_ms))  # determinism-ok: stats
        if isinstance(d.body, RunStart):
            await self._open(d)
            return
        if isinstance(d.body, CaseMessage):
            self.case, self.index, self.progress = d.body.case, d.body.index, CaseProgress()
        ctx, generation = self.ctx, self.generation
        try:
            stage = await run_one_stage(ctx, self.case, self.index, self.progress)
            if generation != self.generation:
                raise _Reloaded()
            if stage != d.stage:
                raise RuntimeError(f"the log's next stage is {stage}, the message is for {d.stage}")
            events = ctx.writer.pending
            batch = w.store.preview_after(self.run_id, events, self.head)
        except _Reloaded:
            self.waiting.setdefault(d.key, []).insert(0, d)  # again, from the reloaded log
            return
        except Exception as exc:  # noqa: BLE001 - the stage failed: nothing was written
            log.exception("run %s case %s: %s failed", self.run_id, self.index, d.stage)
            self._reset()  # the projection saw the stage's unwritten events: reopen from the log
            await self._fail(d, "failed", f"{d.stage} of case {self.index} failed: {exc!r}")
            return
        # The batch goes to the changelog and the next command to its stage topic, in one produce
        # request (both queued here, neither awaited); the committer writes the batch with the
        # consumed offset once the changelog has acknowledged it.
        logged = None
        if batch and w.publish_changelog is not None:
            logged = await w.publish_changelog(batch, confirm=False)
        nxt = next_stage(self.progress)  # None: the case is done
        cmd = sent = None
        if nxt is not None and w.publish_stage is not None:
            cmd = StageCommand(run_id=self.run_id, index=self.index, case_id=self.case.case_id)
            sent = await w.publish_stage(nxt, cmd, confirm=False)
        if generation != self.generation:
            # Reloaded while the produce was queued (a commit failed): the batch continues the
            # changelog all the same; the step is taken up again from the reloaded log.
            self.waiting.setdefault(d.key, []).insert(0, d)
            return
        step = Step(self, d, stage, ctx.writer.committed_seq, batch, logged, started,
                    asyncio.get_running_loop().create_future())
        # The writer goes on as if the batch were in the file: the next batch chains onto it.
        ctx.writer.pending = []
        if batch:
            ctx.writer.committed_seq = batch[-1].seq
            ctx.projection.last_chain = batch[-1].chain
            self.head = (batch[-1].seq, batch[-1].chain)
        w.committer.submit(step)
        if w.keep_step_log:
            w.stats.step_log.append((self.run_id, self.index, stage))
        if stage == "govern":
            done = ctx.projection.state.cases_completed
            self.case, self.index, self.progress = None, None, CaseProgress()
            w.cache.flush()
            if (w.checkpoint_every and done % w.checkpoint_every == 0) or done == self.expected_cases:
                await w.committer.settle([self])  # a checkpoint is of a projection the file holds
                if self.ctx is ctx and self.generation == generation and not self.uncommitted:
                    w.committer.write_checkpoint(self.run_id, checkpoint_of(ctx.projection))
            if done == self.expected_cases:
                log.info("run %s: all %d cases done", self.run_id, done)
        elif sent is not None:
            topic = w.topics.stage(nxt)
            if w.owns(topic, self.partition):
                self._deliver_ahead(nxt, topic, cmd, sent)
            else:
                # Another worker consumes the next stage: it must find this step in its file or the
                # changelog, so this one waits for its commit (as every step did before pipelining).
                await asyncio.shield(step.committed)
                await self._confirm(sent, nxt)

    def _deliver_ahead(self, stage: str, topic: str, cmd: StageCommand, sent: asyncio.Future) -> None:
        """Take up the next command now, before the broker acknowledges it; its offset comes later.

        Its step is committed only once the offset is known (from the acknowledgement, or from the
        consumer's copy if that arrives first), so the file never records a step whose command is
        not in Kafka; a command the broker refuses fails the run's uncommitted steps (reload, restore).
        """
        w = self.worker
        key = (cmd.index, STAGE_INDEX[stage])
        d = Delivery(stage, cmd, topic, self.partition, None, 0, time.monotonic(), key, own=True, sent=sent)
        self.ahead[key] = d
        tracker = w.offsets.get((topic, self.partition))  # an ack after a revoke must not open an offset

        def acked(fut: asyncio.Future) -> None:
            if self.ahead.get(key) is d:
                del self.ahead[key]
            if fut.cancelled() or fut.exception() is not None:
                d.lost = asyncio.CancelledError() if fut.cancelled() else fut.exception()
                self._lost(stage, fut)
            elif d.offset is None:  # the consumer has not fetched its copy yet: that copy is an echo
                d.offset = fut.result().offset
                if tracker is not None and w.offsets.get((topic, self.partition)) is tracker:
                    tracker.delivered_own(d.offset)
            w.committer.schedule()

        sent.add_done_callback(acked)
        w.stats.own_deliveries += 1
        self.deliver(d)

    def copy_of_ahead(self, stage: str, key: tuple[int, int], offset: int) -> bool:
        """The consumer fetched a command this run took up ahead of its ack: give that delivery its offset."""
        d = self.ahead.get(key)
        if d is None or d.stage != stage:
            return False
        del self.ahead[key]
        d.offset = offset
        return True

    async def _confirm(self, sent, stage: str) -> None:
        try:
            await sent
        except Exception:  # noqa: BLE001
            self._lost(stage, sent)

    def _lost(self, stage: str, sent) -> None:
        log.error("run %s: the %s command was not acknowledged (%r); re-producing it from the log", self.run_id,
                  stage, None if sent.cancelled() else sent.exception())
        self.worker.schedule_restore(self.partition)  # its kick produces the run's next command again

    def reload(self) -> None:
        """Forget the in-memory state; the next step reopens the run from the log."""
        self._reset()

    def _reset(self) -> None:
        self.generation += 1
        self.loaded = False
        self.ctx = None
        self.head = None
        self.case, self.index, self.progress = None, None, CaseProgress()

    async def _open(self, d: Delivery) -> None:
        w = self.worker
        self.expected_cases = d.body.cases
        spec = d.body.spec
        try:
            # Publish run.started before writing it, as every batch (see _process).
            started = NewEvent(spec.started_event(w.cache.embedder.name, d.body.cases))
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
            self.ctx, _how = open_run(w.store, self.run_id, spec, w.cache, cases=d.body.cases, **w.backbone_opts)
        except RunMismatch as exc:
            await self._fail(d, "rejected", str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - e.g. a backbone this worker cannot build
            log.exception("run %s cannot be opened", self.run_id)
            self._reset()
            await self._fail(d, "failed", f"run cannot be opened: {exc!r}")
            return
        self.head = w.store.head(self.run_id)
        w.stats.runs_opened += 1
        self.case, self.index, self.progress = None, None, CaseProgress()
        log.info("run %s opened (%d cases announced)", self.run_id, d.body.cases)
        w.finished(d)
        w.committer.schedule()  # its position goes to DuckDB with the next commit (a redelivery is skipped)
