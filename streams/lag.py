"""`--lag k`: up to k+1 cases in flight, deterministically (DESIGN §3).

What a case sees. Case i *acts* on the memory as of the end of case i-1-k: its retrieve and act
stages (the memory shown to the agent, per-step retrieval included) read a copy of the memory
pinned at that version. Its feedback, reflect and govern stages *learn* in case order, on the live
memory (as of the end of case i-1), exactly as with k = 0, so two cases never write memory from
the same stale state (item ids stay unique, no update is lost). With k = 0 this is the strict
order: the pinned version is the live one.

Why it is deterministic. Every case's events are emitted in case order by the in-order pass
below, each case's contiguously, as with k = 0; what they hold depends on the case, the pinned
version (a function of k and the log, never of timing) and the model's replies. `lag` is in
`run.started`, so a resume, a replay or `verify` pins the same versions (a resume rebuilds them
from the log: `store.projection.projections_at`).

Where the time goes. With a live model backbone each case is executed twice over its pinned
memory: ahead of its turn (as soon as its version exists, concurrently with the k cases before
it, writing nothing; `handlers/llm/prefetch.py` keeps the replies), then in order, for real, served
from those replies. So up to k+1 cases' agent turns wait on the model at once. The ahead pass also
speculates feedback and reflection over the pinned memory: a reply is served in order only to the
very same request, so a reflection whose prompt reads the live memory is simply asked again, live.
With `sim` or a recorded backbone there is nothing to wait on, and only the pinning applies.

Who drives it. `AheadPass` (the ahead pass of one run) is shared: the embedded runner drives it
through `LagPipeline` below, over the case list it holds; the Kafka worker's `RunActor`
(streams/kafka_worker/actor.py) drives it over the case messages waiting in its mailbox, pinning
each version when its case completes (or folding it from the log after a restart or a takeover).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
from typing import Awaitable, Callable, Sequence

from grandrounds.handlers.cases import Case
from grandrounds.handlers.context import EventWriter, RunContext
from grandrounds.handlers.deidentify import Deidentifier
from grandrounds.handlers.llm.errors import ModelOutage
from grandrounds.handlers.llm.prefetch import PrefetchTransport
from grandrounds.handlers.pipeline import CaseProgress, next_stage, run_stage
from grandrounds.handlers.stages import STAGE_TABLE
from grandrounds.store import event_types as ev
from grandrounds.store.projection import MemoryProjection, copy_projection, projections_at

log = logging.getLogger("grandrounds.lag")

PINNED_STAGES = tuple(s.name for s in STAGE_TABLE if s.pinned)
"""The stages that read the pinned memory version (retrieve, act: the stage table's `pinned`); the others
learn on the live memory, in order."""
AHEAD_STAGES = tuple(s.name for s in STAGE_TABLE if s.ahead)
"""What the ahead pass runs over the pinned memory, writing nothing (retrieve, act, feedback, reflect: the
stage table's `ahead`). feedback and reflect are speculation: their replies are served only where the in-order pass, on the live memory, sends the
very same request (a reflection prompt built from what the case was shown, say); else it asks live."""

StageDone = Callable[[str], Awaitable[None]]


class ScratchWriter(EventWriter):
    """The ahead pass's writer: hands out seqs, keeps nothing, changes no projection. Its own
    de-identifier sees the case's `case.received`, so retrieval queries are scrubbed as in order."""

    def __init__(self, store, run_id: str, projection: MemoryProjection, directory):
        super().__init__(store, run_id, projection)
        self.deidentifier = Deidentifier(store, run_id, directory)
        self._emitted = 0

    def emit(self, payload, case_id=None, causation_seq=None, meta=None) -> int:
        self.deidentifier.observe(payload, case_id)
        self._emitted += 1
        return self.committed_seq + self._emitted

    def flush(self, consumed=None):
        return []


def _wire_prefetch(backbone):
    """(PrefetchTransport, backbone for the ahead pass), or (None, None) when the backbone has no live
    model to wait on (sim, a recorded run)."""
    gateway = getattr(backbone, "gateway", None)
    transport = getattr(gateway, "transport", None)
    if transport is None or getattr(transport, "served", None) != "live":
        return None, None
    if not isinstance(transport, PrefetchTransport):
        transport = PrefetchTransport(transport)
        gateway.transport = transport
    ahead = copy.copy(backbone)
    ahead.gateway = dataclasses.replace(gateway, transport=transport.ahead)
    return transport, ahead


@contextlib.contextmanager
def pinned_memory(ctx: RunContext, pinned: MemoryProjection):
    """A pinned stage (retrieve, act) reads `pinned`; its events still go to the live log and projection."""
    live, ctx.projection = ctx.projection, pinned
    try:
        yield
    finally:
        ctx.projection = live


def pinned_versions(ctx: RunContext, indices) -> dict[int, MemoryProjection]:
    """The memory each case index in `indices` reads under the run's lag k: as of the end of case
    index-1-k, folded from the log in one pass (a copy of the live projection where that is the
    version). Every one of those versions must be in the log already (or be the live one): the
    embedded runner and the Kafka worker call this on (re)opening a run, before they go on."""
    lag = ctx.lag
    ends = version_seqs(ctx, {i - 1 - lag for i in indices})
    wanted = {i: ends[i - 1 - lag] for i in indices}
    live = ctx.projection.seq
    folded = projections_at(ctx.writer.store, ctx.run_id, ctx.projection._cache,
                            [s for s in wanted.values() if s != live], ctx.projection.exact_limit)
    return {i: copy_projection(ctx.projection) if seq == live else folded[seq] for i, seq in wanted.items()}


def version_seqs(ctx: RunContext, cases: set[int]) -> dict[int, int]:
    """The seq each memory version "end of case j" ends at (j < 0: before the first case), read from
    the log in one pass over its `case.completed` events."""
    store, run_id = ctx.writer.store, ctx.run_id
    out: dict[int, int] = {}
    if any(j < 0 for j in cases):
        received = store.iter(run_id, types=[ev.CaseReceived.event_type], batch=1)
        first = next(received, None)
        received.close()
        before = first.seq - 1 if first is not None else ctx.projection.seq
        out.update({j: before for j in cases if j < 0})
    wanted = {j for j in cases if j >= 0}
    if wanted:
        for e in store.iter(run_id, types=[ev.CaseCompleted.event_type]):
            index = e.decode().index
            if index in wanted:
                out[index] = e.seq
    missing = sorted(wanted - set(out))
    if missing:
        raise ValueError(f"run {run_id!r}: case {missing[0]} is not completed in the log")
    return out


class AheadPass:
    """Runs cases ahead of their turn over their pinned memory, writing nothing, so the in-order pass
    is served the model's replies (`served: "prefetched"`). One per run context: the embedded runner
    (`LagPipeline`) and the Kafka worker (`RunActor`) drive it; both await a case's ahead pass before
    its in-order pass (the two share the pinned projection, and the in-order pass must find the
    replies there, not ask again). Inert (`live` False) with a backbone that has no model to wait on."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.prefetch, self.backbone = _wire_prefetch(ctx.backbone)
        self.tasks: dict[int, asyncio.Task] = {}
        self.failures: list[str] = []
        """Cases whose ahead pass stopped on an error other than an outage (they ran live, in order)."""

    @property
    def live(self) -> bool:
        return self.prefetch is not None

    def send(self, index: int, case: Case, pinned: MemoryProjection) -> None:
        """Run case `index` ahead over `pinned` (once; the task is awaited by `wait`)."""
        if self.prefetch is not None and index not in self.tasks:
            self.tasks[index] = asyncio.ensure_future(self._run(index, case, pinned))

    async def wait(self, index: int) -> None:
        """Case `index` is about to run in order: let its ahead pass finish (its replies are what it is served)."""
        task = self.tasks.pop(index, None)
        if task is not None:
            # Waited for, never awaited: one cancelled by `cancel` (the run's state was dropped meanwhile)
            # is no reason to stop the caller, which finds that out its own way.
            await asyncio.wait([task])

    def forget(self, case_id: str) -> None:
        """The case ran in order: drop the replies it did not ask for."""
        if self.prefetch is not None:
            self.prefetch.forget(case_id)

    async def _run(self, index: int, case: Case, pinned: MemoryProjection) -> None:
        ctx = self.ctx
        scratch = RunContext(run_id=ctx.run_id, policy=ctx.policy, backbone=self.backbone, projection=pinned,
                             writer=ScratchWriter(ctx.writer.store, ctx.run_id, pinned, ctx._patient_directory),
                             seed=ctx.seed,
                             tools=dict(ctx.tools), lag=ctx.lag, environment=ctx.environment)
        progress = CaseProgress()
        try:
            while (stage := next_stage(progress)) in AHEAD_STAGES:
                await run_stage(scratch, case, index, progress, stage)
        except ModelOutage:
            return None  # the in-order pass meets it too, and raises it there, naming its case
        except Exception as exc:  # noqa: BLE001 - the in-order pass is authoritative: it meets the same
            # failure or fetches live what is missing; said, so a broken ahead pass is not silently slow
            self.failures.append(f"{case.case_id}: {exc!r}")
            log.warning("--lag: case %s could not run ahead (%r); it runs in order, live", case.case_id, exc)

    def cancel(self) -> list[asyncio.Task]:
        """Stop every case still running ahead (the run stopped, or its state was dropped); returns the tasks."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        self.tasks.clear()
        return tasks

    async def close(self) -> None:
        """`cancel`, and wait until they have stopped."""
        for task in self.cancel():
            try:
                await task
            except asyncio.CancelledError:
                pass


class LagPipeline:
    """Pins each case to its memory version and runs it ahead; the runner drives it in case order."""

    def __init__(self, ctx: RunContext, cases: Sequence[Case]):
        if ctx.lag < 1:
            raise ValueError("a lag pipeline needs lag >= 1")
        self.ctx = ctx
        self.cases = cases
        self.lag = ctx.lag
        self.pinned: dict[int, MemoryProjection] = {}
        self.ahead = AheadPass(ctx)

    def start(self, start: int, interrupted: bool) -> None:
        """Pin cases start .. start+lag (their versions are all in the log or live now) and send them
        ahead; `interrupted`: case `start` is half done (it is finished in order, not sent ahead)."""
        window = range(start, min(start + self.lag + 1, len(self.cases)))
        self.pinned.update(pinned_versions(self.ctx, window))
        for i in window:
            if not (interrupted and i == start):
                self.ahead.send(i, self.cases[i], self.pinned[i])

    def case_done(self, index: int) -> None:
        """Case `index` has emitted all its events: its end is the version case index+1+lag reads."""
        nxt = index + 1 + self.lag
        if nxt < len(self.cases):
            self.pinned[nxt] = copy_projection(self.ctx.projection)
            self.ahead.send(nxt, self.cases[nxt], self.pinned[nxt])

    async def process(self, case: Case, index: int, progress: CaseProgress | None, on_stage: StageDone):
        """Case `index` in order: retrieve and act on its pinned memory, the rest on the live memory."""
        await self.ahead.wait(index)
        pinned = self.pinned.pop(index)
        ctx = self.ctx
        p = progress or CaseProgress()
        try:
            while (stage := next_stage(p)) is not None:
                if stage in PINNED_STAGES:
                    with pinned_memory(ctx, pinned):
                        await run_stage(ctx, case, index, p, stage)  # its events still go to the live log
                else:
                    await run_stage(ctx, case, index, p, stage)
                await on_stage(stage)
        finally:
            self.ahead.forget(case.case_id)
        return p.completed

    async def close(self) -> None:
        """Stop what is still running ahead (a run that stopped early: an outage, an error)."""
        await self.ahead.close()
