"""Partitions coming and going: assignment (restore from the changelog, kick), revocation, release.

On assignment of partition p: import from changelog partition p the events this DuckDB file
lacks, re-produce lost commands, and resume each topic at the offset stored in DuckDB (where the
file has none: the group's committed offset, else the beginning). Until that takeover is done, the
partition's messages wait (`Intake.accept`, `RunActor._drain`); a takeover that fails (the
changelog unreachable for a moment) is retried with backoff, never reported against the messages
waiting on it: nothing is wrong with them.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from grandrounds.handlers.pipeline import case_progress
from grandrounds.handlers.stages import INTAKE_STAGE, next_stage
from grandrounds.store.errors import Retryable
from grandrounds.store.event_types import CaseReceived
from grandrounds.store.eventstore import ConsumedOffset
from grandrounds.streams.changelog import changelog_consumer, import_partitions
from grandrounds.streams.kafka_worker.actor import RunActor
from grandrounds.streams.messages import StageCommand
from grandrounds.streams.offsets import PartitionOffsets
from grandrounds.streams.topics import partition_for

log = logging.getLogger("grandrounds.kafka")

TRANSIENT = (Retryable, OSError, asyncio.TimeoutError, KafkaError)
"""Takeover failures of the infrastructure (broker, network, a locked file): retried while they last."""


class Rebalance:
    """KafkaWorker's part that follows the group's assignments (state: `owners`, `takeovers`, `offsets`)."""

    takeover_retry = (0.5, 30.0)
    """First and longest wait (s) between attempts of a failed takeover."""
    max_takeover_attempts = 3
    """Attempts of a takeover failing for a reason other than the infrastructure (`TRANSIENT`)."""

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
            # Usually the restore is done before the consumer starts fetching. Bounded: a takeover that
            # keeps failing must not hold the group's rebalance; its messages wait for it (Intake.accept).
            await asyncio.wait({self.takeovers[p] for p in parts}, timeout=self.revoke_timeout)
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
        """`_take_over_once` until it succeeds (or a revoke cancels it), with exponential backoff.

        The partitions' messages wait for it. Failing them instead (the takeover's exception raised
        into `accept`) sent valid messages to the dead letters, which stops every client following
        their runs, for what was the changelog being unreachable for a moment. Retrying is safe: the
        restore imports only what the file lacks, and a command the kick re-produces twice is skipped.

        A failure of the infrastructure (`TRANSIENT`) is retried for as long as it lasts. Any other
        failure is a bug that retrying will not fix: after `max_takeover_attempts` it is logged as an
        error and the partitions go on without it (what they did before it was retried), rather than
        waiting for ever.
        """
        delay, longest = self.takeover_retry
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._take_over_once(parts)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried: nothing is wrong with the waiting messages
                self.stats.takeover_failures += 1
                if not isinstance(exc, TRANSIENT) and attempt >= self.max_takeover_attempts:
                    log.error("%s: takeover of partitions %s failed %d times (%r), not an infrastructure failure: "
                              "going on without it", self.worker_id, parts, attempt, exc, exc_info=exc)
                    return
                log.warning("%s: takeover of partitions %s failed (attempt %d: %r); retrying in %.1fs",
                            self.worker_id, parts, attempt, exc, delay)
                await asyncio.sleep(delay)
                delay = min(longest, delay * 2)

    async def _take_over_once(self, parts: list[int]) -> None:
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
            try:
                received = self.store.last_of_type(info.run_id, CaseReceived.event_type)
                payload = None if received is None else received.decode()
            except Exception as exc:  # noqa: BLE001 - one run this worker cannot read must not stop the others
                log.warning("%s: run %s cannot be read to kick it (%r); skipped", self.worker_id, info.run_id, exc)
                continue
            if received is None:
                continue
            progress = case_progress(self.store, info.run_id, received.case_id, after_seq=received.seq - 1)
            if progress.completed is not None:
                continue
            nxt = next_stage(progress)
            if nxt == INTAKE_STAGE or self.publish_stage is None:  # the intake is the submitter's to produce
                continue
            await self.publish_stage(nxt, StageCommand(run_id=info.run_id, index=payload.index,
                                                       case_id=received.case_id))
            self.stats.kicks += 1
            log.info("%s: re-produced %s command for run %s case %d", self.worker_id, nxt, info.run_id, payload.index)
