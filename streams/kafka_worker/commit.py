"""The DuckDB side of a step: each processed stage's events with its consumed offset, grouped.

(The Kafka side, the consumer group's offsets, is group_offsets.py.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable

from grandrounds.handlers.stages import closes_case
from grandrounds.store.eventstore import ConsumedOffset
from grandrounds.store.events import StoredEvent
from grandrounds.store.projection import Checkpoint, write_checkpoint
from grandrounds.store.signing import SigningKey, sign_head
from grandrounds.streams.kafka_worker.delivery import Delivery, DeliveryState

# `RunActor` and `KafkaWorker` in annotations are named, not imported: they import this module.

log = logging.getLogger("grandrounds.kafka")


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

    def sign_head(self, run_id: str, key: SigningKey) -> None:
        """Sign the run's head (store/signing.py) on the commit thread, after the transactions queued
        there: the head signed is the file's, with the run's last step in it. As the embedded runner
        does when a key is configured; the key stays in this process, never in the file."""
        w = self.worker

        def signed(fut: asyncio.Future) -> None:
            if fut.cancelled() or fut.exception() is not None:
                log.error("signing the head of run %s failed: %r", run_id, None if fut.cancelled() else fut.exception())
            else:
                w.stats.signed_heads += 1

        if self._pool is None:
            fut = asyncio.get_running_loop().create_future()
            try:
                fut.set_result(sign_head(w.store, run_id, key))
            except Exception as exc:  # noqa: BLE001
                fut.set_exception(exc)
            signed(fut)
            return
        asyncio.get_running_loop().run_in_executor(self._pool, sign_head, w.store, run_id, key).add_done_callback(signed)

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
            if key in held or (logged is not None and not logged.done()) or step.d.state is DeliveryState.AHEAD:
                held.add(key)  # a run's steps are committed in order
                rest.append(step)
            elif (logged is not None and (logged.cancelled() or logged.exception() is not None)) or (
                    step.d.state is DeliveryState.LOST):
                held.add(key)
                rest.append(step)
                failed.append(step)
            else:
                ready.append(step)
        self.queue = rest
        for step in failed:
            if not step.dropped:
                if step.d.state is DeliveryState.LOST:
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
        if closes_case(step.stage):
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
            if s.d.state is not DeliveryState.LOST:  # a refused command is not in Kafka: the kick produces it again
                actor.waiting.setdefault(s.d.key, []).append(s.d)  # after the restore: skipped, or run again
            actor.committed_one()
        actor.resume()
