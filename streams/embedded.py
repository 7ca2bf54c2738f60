"""The embedded runner: drives the handlers in-process over a list of cases, no broker.

Cases run strictly in order, or with the run's `lag` k > 0 up to k+1 at once (streams/lag.py: case
i acts on the memory as of case i-1-k; events still go to the log in case order). When their events reach the file is the commit mode's choice;
which bytes they are never is (seqs are assigned at emit time, and the stages read the live
projection, not the log), so every mode writes identical bytes:
- `group` (default): a case's events stay buffered until `GroupCommit.cases` cases are
  pending or `GroupCommit.ms` milliseconds have passed since the first of them, then go in as
  one transaction and one multi-row INSERT. A DuckDB commit costs ~1-3 ms here, several
  times the handlers' own work on a warm cache, so paying it once per group is what makes a
  case cheap. A crash loses the uncommitted cases only: the log always ends at a case
  boundary, and a resumed run executes them again, to the same bytes. With a model backbone a
  case outlasts `ms`, so every case is committed as it ends (no model call is redone).
- `case`: one commit when each case ends.
- `stage`: a commit after every stage, so a crash loses at most the stage in flight.
A resumed run skips completed cases and finishes a half-done case from the stage where it
stopped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from grandrounds.handlers.cases import Case
from grandrounds.handlers.context import RunContext
from grandrounds.handlers.llm.errors import ModelOutage
from grandrounds.handlers.pipeline import CaseProgress, case_progress, process_case
from grandrounds.store.projection import save_checkpoint
from grandrounds.streams.collector import fewer_collections
from grandrounds.streams.lag import LagPipeline

Progress = Callable[[int, bool], None]  # (case index, correct)
CommitMode = Literal["stage", "case", "group"]


@dataclass(frozen=True)
class GroupCommit:
    """When a group of buffered cases is committed: whichever bound is reached first."""

    cases: int = 64
    """Cases per commit at most (benchmarks/bench_core.py: per-case overhead levels off past ~32)."""
    ms: float = 250.0
    """Milliseconds the first buffered case may wait for its commit at most (read on the monotonic
    clock: it decides when bytes reach the file, never which bytes)."""

    def __post_init__(self) -> None:
        if self.cases < 1 or self.ms < 0:
            raise ValueError("a group commit needs cases >= 1 and ms >= 0")


TRIM_EVERY = 1024
"""Cases between two trims of DuckDB's block cache (`EventStore.trim_cache`), at a group commit."""


class EmbeddedRunner:
    def __init__(self, ctx: RunContext, commit: CommitMode = "group", checkpoint_every: int = 250,
                 group: GroupCommit = GroupCommit(), final_checkpoint: bool = True):
        if commit not in ("stage", "case", "group"):
            raise ValueError(f"unknown commit mode {commit!r} (stage, case, group)")
        self.ctx = ctx
        self.commit = commit
        self.checkpoint_every = checkpoint_every
        self.final_checkpoint = final_checkpoint
        self.group = group if commit == "group" else GroupCommit(cases=1, ms=0)
        self._buffered = 0
        self._first_buffered_at = 0.0
        self.trim_every = TRIM_EVERY
        self._trimmed_at = 0

    async def _flush_stage(self, stage: str) -> None:
        if self.commit == "stage":
            self.ctx.writer.flush()

    def _case_done(self) -> None:
        """A case's events are all emitted: commit them now, or leave them for the group's commit."""
        if self._buffered == 0:
            self._first_buffered_at = time.monotonic()
        self._buffered += 1
        waited_ms = (time.monotonic() - self._first_buffered_at) * 1000
        if self._buffered >= self.group.cases or waited_ms >= self.group.ms:
            self.flush()

    def flush(self) -> None:
        self.ctx.writer.flush()
        self._buffered = 0
        cache = self.ctx.projection.cache
        if cache is not None:  # new vectors go to the file with their group, not all at the end of the run:
            cache.flush()  # the cache then keeps only the recent ones in memory (store/embeddings.py)
        # DuckDB's automatic checkpoint (at 16 MiB of WAL) holds memory that grows with the table and
        # set a long run's peak; taken here first, it runs under a bound (EventStore.checkpoint_bounded).
        self.ctx.writer.store.checkpoint_if_due()
        done = self.ctx.projection.state.cases_completed
        if self.trim_every and done - self._trimmed_at >= self.trim_every:
            # DuckDB keeps every block it wrote cached until 80 % of RAM: a long run held its whole
            # file. This runner is the database's only user, on one thread, so it may trim.
            self.ctx.writer.store.trim_cache()
            self._trimmed_at = done

    async def run(self, cases: Sequence[Case], on_case: Progress | None = None) -> int:
        """Process every case not yet completed; returns how many were processed now.

        On an exception the buffered cases are left uncommitted (the log ends at the last group),
        as after a crash: the same command executes them again. A model outage (`ModelOutage`)
        commits the cases completed before it and drops only the interrupted one. The garbage
        collector runs less often meanwhile (streams/collector.py: ~12 % of a sim replay's CPU)."""
        with fewer_collections():
            return await self._run(cases, on_case)

    async def _run(self, cases: Sequence[Case], on_case: Progress | None) -> int:
        ctx = self.ctx
        state = ctx.projection.state
        start = state.cases_completed
        if start > len(cases):
            raise ValueError(f"run {ctx.run_id!r} has {start} completed cases, more than the {len(cases)} given")
        done_now = 0
        saved_at = start  # cases completed at the last checkpoint written (or at open)
        lagged = LagPipeline(ctx, cases) if ctx.lag and start < len(cases) else None
        try:
            for index in range(start, len(cases)):
                case = cases[index]
                progress: CaseProgress | None = None
                if state.cases_received > state.cases_completed:  # a case was interrupted mid-way
                    progress = case_progress(ctx.writer.store, ctx.run_id, case.case_id)
                    if not progress.started:
                        raise ValueError(f"run {ctx.run_id!r}: the interrupted case is not {case.case_id!r}; "
                                         "resume it with the same case file")
                if lagged is not None and index == start:
                    lagged.start(start, interrupted=progress is not None)
                boundary = len(ctx.writer.pending)
                try:
                    if lagged is None:
                        completed = await process_case(ctx, case, index, progress, on_stage=self._flush_stage)
                    else:
                        completed = await lagged.process(case, index, progress, on_stage=self._flush_stage)
                except ModelOutage:
                    # An outage is not a result: the cases finished before it are, so they are committed
                    # (a rerun must not call the model for them again); the interrupted case's events
                    # are dropped, and the same command resumes at it.
                    del ctx.writer.pending[boundary:]
                    self.flush()
                    raise
                if lagged is not None:
                    lagged.case_done(index)
                self._case_done()
                done_now += 1
                if on_case:
                    on_case(index, completed.correct)
                if self.checkpoint_every and (index + 1) % self.checkpoint_every == 0 and index + 1 >= 2 * saved_at:
                    # Every `checkpoint_every` cases at first, then each time the run has doubled: a
                    # checkpoint encodes and writes the whole memory as one blob (RSS jumps by ~10x the
                    # blob while it is written), so writing one every 250 cases made a long run's cost
                    # quadratic and its peak memory grow with the count of writes. A resume catches up
                    # at most half the run from the log (the projection is a pure fold: same state).
                    self.flush()  # a checkpoint reflects committed events only
                    save_checkpoint(ctx.writer.store, ctx.run_id, ctx.projection)
                    saved_at = index + 1
        finally:
            if lagged is not None:
                await lagged.close()
        self.flush()
        if self.final_checkpoint and not (done_now and saved_at == start + done_now):  # not the one just written
            save_checkpoint(ctx.writer.store, ctx.run_id, ctx.projection)
        return done_now
