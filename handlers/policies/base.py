"""What a memory policy does at each stage of a case, and how it asks the backbone for help.

The five stages (handlers/retrieve|act|feedback|reflect|govern.py) own the pipeline's
events (case received, answer, grading, completion); a `MemoryPolicy` owns everything
about memory: what to show the agent, how outcomes are attributed, what is learnt, and the
periodic housekeeping. A policy changes memory only by emitting events through
`ctx.writer`, which folds them into the projection as they are emitted.

Model work a policy needs (distillation, step judging, lesson writing) is a `ModelTask`:
a prompt, a pydantic response model and the offline answer the `sim` backbone gives.
Backbones execute tasks through `solve`; model backbones record the exchange first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generic, TypeVar

from pydantic import BaseModel

# The agent loops' side of per-step memory lives with them (handlers/agent/step_memory.py, below the
# policies); re-exported here, where the policies have always found it.
from grandrounds.handlers.agent.step_memory import SUMMARISER, StepMemory, agent_state  # noqa: F401
from grandrounds.handlers.agent.retrosum import Retrospection
from grandrounds.handlers.llm.errors import CaseFailure
from grandrounds.handlers.llm.recorder import records_exchanges, stage_recorder
from grandrounds.handlers.policies.render import render_prefix
from grandrounds.store.event_types import (AnswerGiven, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded,
                               RuleOutcome, ToolOutcome)
from grandrounds.store.llm_events import CaseFailed

if TYPE_CHECKING:
    from grandrounds.handlers.cases import Case, CaseView
    from grandrounds.handlers.context import RunContext

M = TypeVar("M", bound=BaseModel)

@dataclass(frozen=True)
class ModelTask(Generic[M]):
    """One structured model call a policy needs."""

    purpose: str
    """Recorded with the exchange (`skill-distill`, `step-judge`, ...)."""
    system: str
    prompt: str
    response: type[M]
    offline: Callable[[], M]
    """The deterministic answer of the `sim` backbone, computed from the same inputs the prompt
    shows (so it may use the gold answer only where the prompt legitimately does)."""


async def ask(ctx: "RunContext", case_id: str, stage: str, task: ModelTask[M]) -> M:
    """Run `task` on the run's backbone; raises `CaseFailure` when it cannot be answered."""
    extra = {"recorder": stage_recorder(ctx.writer, case_id, stage)} if records_exchanges(ctx.backbone) else {}
    return await ctx.backbone.solve(task, **extra)


async def ask_or_fail(ctx: "RunContext", case_id: str, stage: str, task: ModelTask[M]) -> M | CaseFailed:
    """`ask`, with a failure recorded as `case.failed` (nothing is learnt from that case)."""
    try:
        return await ask(ctx, case_id, stage, task)
    except CaseFailure as exc:
        failed = CaseFailed(stage=stage, reason=exc.reason, steps=exc.steps)
        ctx.writer.emit(failed, case_id=case_id)
        return failed


class MemoryPolicy:
    """The memory-free behaviour; policies override what they do. One instance per run."""

    def __init__(self, config):
        self.config = config

    @property
    def writes(self) -> bool:
        """False when memory is frozen (offline test mode, the w/o-writing ablation)."""
        return bool(getattr(self.config, "writing", False))

    def retrieve(self, ctx: "RunContext", case: "Case", memory_seq: int) -> MemoryRetrieved:
        """Stage 1: what the agent is shown for this case. Must honour the leakage guard."""
        return MemoryRetrieved(memory_seq=memory_seq, prefix=render_prefix([], [], []))

    def step_memory(self, ctx: "RunContext", view: "CaseView", memory: MemoryRetrieved) -> StepMemory | None:
        """Stage 2: per-step retrieval for the agent loop, or None (everything was in `memory`)."""
        return None

    def retrospection(self, ctx: "RunContext", view: "CaseView", memory: MemoryRetrieved) -> Retrospection | None:
        """Stage 2: the policy's own retrospective summaries for a model agent loop (RetroSum), or None
        (the loop's `--summary-every`)."""
        return None

    def outcomes(self, ctx: "RunContext", case: "Case", memory: MemoryRetrieved, answer: AnswerGiven,
                 correct: bool) -> tuple[list[RuleOutcome], list[ToolOutcome]]:
        """Stage 3: outcome attribution recorded with the grading."""
        return [], []

    async def reflect(self, ctx: "RunContext", case: "Case", memory: MemoryRetrieved, answer: AnswerGiven,
                      fb: FeedbackRecorded) -> ReflectionRecorded | CaseFailed | None:
        """Stage 4 (gold visible): learn from the case by emitting memory events."""
        return None

    async def govern(self, ctx: "RunContext", case: "Case", index: int, fb: FeedbackRecorded) -> None:
        """Stage 5: periodic housekeeping (labels, merges, capacity) before the case closes."""
        return None


class NoMemory(MemoryPolicy):
    """`none`: the memory-free ReAct baseline on the same pipeline."""
