"""One run's mailbox and the task that works through it strictly in order."""

from __future__ import annotations

import asyncio
import logging
import time

from grandrounds.handlers.cases import Case
from grandrounds.handlers.code_versions import code_versions
from grandrounds.handlers.runs import RunMismatch, read_spec, spec_difference
from grandrounds.handlers.pipeline import case_progress, run_stage
from grandrounds.handlers.stages import CaseProgress, closes_case, next_stage
from grandrounds.store.errors import Bug, InvalidInput, where_raised
from grandrounds.store.event_types import CaseReceived
from grandrounds.store.events import NewEvent, StoredEvent
from grandrounds.store.projection import MemoryProjection, checkpoint_of, copy_projection, save_checkpoint
from grandrounds.streams.kafka_worker.commit import Step
from grandrounds.streams.kafka_worker.delivery import START_KEY, STAGE_INDEX, Delivery, DeliveryState
from grandrounds.streams.lag import PINNED_STAGES, AheadPass, pinned_memory, pinned_versions
from grandrounds.streams.messages import CaseMessage, DeadLetter, RunStart, StageCommand
from grandrounds.streams.session import Session

# `KafkaWorker` in annotations is named, not imported: worker.py imports this module.

log = logging.getLogger("grandrounds.kafka")


async def run_one_stage(ctx, case: Case, index: int, progress: CaseProgress) -> str:
    """Run the stage the case runs next (handlers/pipeline.py's stage machine), and only that one:
    a Kafka message is one stage."""
    stage = next_stage(progress)
    if stage is None:
        raise Bug(f"case {case.case_id} was already complete")
    await run_stage(ctx, case, index, progress, stage)
    return stage


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

    def __init__(self, worker: "KafkaWorker", run_id: str, partition: int):
        self.worker = worker
        self.run_id = run_id
        self.partition = partition
        self.waiting: dict[tuple[int, int], list[Delivery]] = {}
        self.task: asyncio.Task | None = None
        self.hold = False
        self.loaded = False
        self.session: Session | None = None
        """The run wired for execution (streams/session.py: context, backbone), as `grandrounds run` wires it;
        None while the run's state is not loaded."""
        self.ctx = None
        """`session.ctx` (the context a test may stand in for)."""
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
        self.pinned: dict[int, MemoryProjection] = {}
        """A run with lag k > 0: case index → the memory its retrieve and act stages read (as of the end
        of case index-1-k; streams/lag.py). Taken when that case completes, else folded from the log."""
        self.lookahead: AheadPass | None = None
        """A run with lag k > 0 and a live model: the cases after the one in flight, run ahead over their
        pinned memory as soon as their message is here (up to k of them), so up to k+1 of the run's
        cases wait on the model at once; each case's in-order pass is served their replies."""

    # --- mailbox -------------------------------------------------------------------------

    def deliver(self, d: Delivery) -> None:
        self.waiting.setdefault(d.key, []).append(d)
        if isinstance(d.body, CaseMessage) and self.pinned:
            self._send_ahead(d.body.index)  # a case whose memory version is here already: it need not wait
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
        self._stop_lookahead()
        if checkpoint and self.ctx is not None and not self.ctx.writer.pending and not self.uncommitted:
            try:
                save_checkpoint(self.worker.store, self.run_id, self.ctx.projection)
            except Exception:  # noqa: BLE001 - a checkpoint is an optimisation
                log.debug("checkpoint of %s failed", self.run_id, exc_info=True)
        self._release()
        self.loaded = False

    def committed_one(self) -> None:
        """The committer is done with one of this run's steps (in the file, or dropped)."""
        self.uncommitted = max(0, self.uncommitted - 1)

    # --- state ---------------------------------------------------------------------------

    def _load(self) -> None:
        """The run as the log has it: projection, and the case in flight with its progress."""
        w = self.worker
        self._release()
        self.case, self.index, self.progress = None, None, CaseProgress()
        self.pinned = {}
        self._stop_lookahead()
        if w.store.has_run(self.run_id):
            spec = read_spec(w.store, self.run_id)
            w.check_backbone(self.run_id, spec)
            self._adopt(Session.open(w.store, w.cache, self.run_id, spec, **self._session_options()))
            self.head = w.store.head(self.run_id)
            state = self.ctx.projection.state
            if state.cases_received > state.cases_completed:
                received = w.store.last_of_type(self.run_id, CaseReceived.event_type)
                payload = received.decode()
                self.case = Case.model_validate(payload.case)
                self.index = payload.index
                self.progress = case_progress(w.store, self.run_id, self.case.case_id, after_seq=received.seq - 1)
        self.loaded = True

    def _session_options(self) -> dict:
        """How the worker opens a run's `Session`: its backbone options (the `--agent` callable, an
        endpoint); no checkpoints of the session's own (the worker writes them, with its commits)."""
        return {"backbone_options": self.worker.backbone_opts, "checkpoint_every": 0, "final_checkpoint": False}

    def _adopt(self, session: Session) -> None:
        self.session, self.ctx = session, session.ctx

    def _release(self) -> None:
        """Drop the run's session: its backbone's clients are closed (in the background; the worker waits
        for them when it closes). The store and embedding cache are the worker's, shared by its runs."""
        session, self.session, self.ctx = self.session, None, None
        if session is not None:
            self.worker.release(session)

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
                await asyncio.wait([takeover])  # a restore may be bringing this run's log up to date
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
            # The configuration must match; the code versions are the worker's (see _open), not the submitter's.
            if recorded is not None and recorded.model_copy(update={"code": d.body.spec.code}) != d.body.spec:
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
        if d.state is DeliveryState.AHEAD:
            # The letter names the command's offset, and the message is done only once that is known
            # (the ack's callback, registered first, sets it).
            await asyncio.wait([d.sent])  # refused: LOST, the command is not in Kafka (offset -1)
        offset = d.offset if d.offset_known else -1
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
            pinned = None
            if ctx.lag and next_stage(self.progress) in PINNED_STAGES:
                pinned = await self._pinned(self.index)
                if pinned is not None:
                    await self._await_ahead(self.index)  # the next cases go ahead meanwhile
                if generation != self.generation:
                    raise _Reloaded()
            if pinned is None:
                stage = await run_one_stage(ctx, self.case, self.index, self.progress)
            else:  # lag k: the case acts on the memory as of case index-1-k; its events go to the live log
                with pinned_memory(ctx, pinned):
                    stage = await run_one_stage(ctx, self.case, self.index, self.progress)
                if stage == PINNED_STAGES[-1]:
                    self.pinned.pop(self.index, None)
            if generation != self.generation:
                raise _Reloaded()
            if stage != d.stage:
                raise Bug(f"the log's next stage is {stage}, the message is for {d.stage}")
            events = ctx.writer.pending
            batch = w.store.preview_after(self.run_id, events, self.head)
        except _Reloaded:
            self.waiting.setdefault(d.key, []).insert(0, d)  # again, from the reloaded log
            return
        except Exception as exc:  # noqa: BLE001 - the stage failed: nothing was written
            log.exception("run %s case %s: %s failed", self.run_id, self.index, d.stage)
            self._reset()  # the projection saw the stage's unwritten events: reopen from the log
            where = where_raised(exc)  # marked by the stage runner: the case id, the stage, the component
            await self._fail(d, "failed", f"{type(exc).__name__} {where}: {exc}" if where else
                             f"{d.stage} of case {self.index} failed: {exc!r}")
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
        if closes_case(stage):
            if ctx.lag:  # the end of this case is the memory case index+1+lag acts on
                self.pinned[self.index + 1 + ctx.lag] = copy_projection(ctx.projection)
                if self.lookahead is not None:
                    self.lookahead.forget(self.case.case_id)
                self._send_ahead(self.index + 1 + ctx.lag)
            done = ctx.projection.state.cases_completed
            complete = ctx.projection.state.run_completed  # this step appended run.completed
            self.case, self.index, self.progress = None, None, CaseProgress()
            w.cache.flush()
            if (w.checkpoint_every and done % w.checkpoint_every == 0) or done == self.expected_cases or complete:
                await w.committer.settle([self])  # a checkpoint (a signed head) is of what the file holds
                if self.ctx is ctx and self.generation == generation and not self.uncommitted:
                    w.committer.write_checkpoint(self.run_id, checkpoint_of(ctx.projection))
                    if complete and w.signing_key is not None:
                        w.committer.sign_head(self.run_id, w.signing_key)
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

    async def _pinned(self, index: int) -> MemoryProjection | None:
        """The memory case `index` acts on under the run's lag. Taken when case index-1-lag completed on
        this worker; else (a run just (re)loaded, or taken over) folded from the log, once the file holds
        every step this worker processed (the version may be among them). Folded with it, in the same
        pass: the versions of the cases after it whose message is here, so they can go ahead now."""
        if index not in self.pinned:
            ctx, generation = self.ctx, self.generation
            if self.uncommitted:
                await self.worker.committer.settle([self])
            if generation != self.generation:
                return None  # reloaded meanwhile: the caller takes the step up again
            # Cases index+1 .. index+lag act on the end of cases index-lag .. index-1: all in the log now.
            after = [j for j in range(index + 1, index + 1 + ctx.lag)
                     if j not in self.pinned and self._waiting_case(j) is not None and self._ahead_pass() is not None]
            self.pinned.update(pinned_versions(ctx, [index, *after]))
        return self.pinned[index]

    # --- the ahead pass (lag k > 0, live model) ---------------------------------------------

    def _ahead_pass(self) -> AheadPass | None:
        """The run's ahead pass; None where there is nothing to run ahead (lag 0, sim, a recorded run)."""
        ctx = self.ctx
        if ctx is None or not ctx.lag:
            return None
        if self.lookahead is None or self.lookahead.ctx is not ctx:
            self._stop_lookahead()
            self.lookahead = AheadPass(ctx)
        return self.lookahead if self.lookahead.live else None

    def _waiting_case(self, index: int) -> Case | None:
        """Case `index`, if its message is waiting here for its turn."""
        for d in self.waiting.get((index, 0), ()):
            if isinstance(d.body, CaseMessage):
                return d.body.case
        return None

    def _send_ahead(self, index: int) -> None:
        """Run case `index` ahead if its memory version and its message are both here and its turn has
        not come yet (the in-order pass, then, has not begun it)."""
        ahead = self._ahead_pass()
        if ahead is None or index not in self.pinned or index == self.index:
            return
        if self.ctx.writer.projection.state.cases_received > index:  # the live memory: ctx.projection is the
            return  # pinned one while a pinned stage runs. Begun (or done) in order already.
        case = self._waiting_case(index)
        if case is not None:
            ahead.send(index, case, self.pinned[index])

    async def _await_ahead(self, index: int) -> None:
        """Case `index` runs a pinned stage in order: send the next `lag` cases ahead (those that can go
        and have not), then let its own ahead pass finish, if it has one still running (its replies are
        what the in-order pass is served)."""
        ahead = self._ahead_pass()
        if ahead is None:
            return
        for j in range(index + 1, index + 1 + self.ctx.lag):
            self._send_ahead(j)
        await ahead.wait(index)

    def _stop_lookahead(self) -> None:
        if self.lookahead is not None:
            self.lookahead.cancel()
            self.lookahead = None

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
                if d.state is DeliveryState.AHEAD:
                    d.lose(asyncio.CancelledError() if fut.cancelled() else fut.exception())
                self._lost(stage, fut)
            elif d.state is DeliveryState.AHEAD:  # the consumer has not fetched its copy yet: that copy is an echo
                d.acknowledge(fut.result().offset)
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
        d.acknowledge(offset)
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
        self.pinned = {}
        self._stop_lookahead()
        self._release()
        self.head = None
        self.case, self.index, self.progress = None, None, CaseProgress()

    async def _open(self, d: Delivery) -> None:
        w = self.worker
        self.expected_cases = d.body.cases
        # The run records the versions of the code that shapes its events: this worker's build.
        spec = d.body.spec.model_copy(update={"code": code_versions(d.body.spec.policy)})
        try:
            w.check_backbone(self.run_id, spec)  # refused before anything is published
        except InvalidInput as exc:
            await self._fail(d, "rejected", str(exc))
            return
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
            self._adopt(Session.open(w.store, w.cache, self.run_id, spec, cases=d.body.cases,
                                     **self._session_options()))
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
