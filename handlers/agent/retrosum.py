"""RetroSum retrospective summarisation (AgentEHR; DESIGN §6).

Every `w` steps a separate model call (purpose `summarise-step-<j>`) re-reads the agent's raw
history and writes a new summary that links early and recent findings; it is recorded as an
`llm.exchange` before it is used, so a recorded run serves it like any other exchange. The actor
then sees the raw history plus the latest summary (`guard.render(summary=...)`): rendering only,
the trajectory keeps everything and gains an `AgentStep(kind="summary")` after the step the summary
was written at.

Two ways to ask for it, one driver (`Retrospector`) for the MCQ and FHIR loops:

- the RetroSum policy's own retrospection (`Retrospection`, from its `summary_every`,
  `retrospect_context` and `end_summary`): as the published code runs it (BlueZeros/AgentEHR,
  `MCPRetroSumAgent`): the summariser also reads its previous summary (`last_summary`); the
  `retrospect_context` ablation takes the look-back from the actor ("summariser": the actor sees the
  latest summary and only the turns after it) or from the summariser ("actor": it reads only the
  steps since its last summary); and a summary is written once more when the episode ends, which
  reflection reads (`summarise-final`);
- the agent loop's `--summary-every` for any other policy (`legacy`): the whole raw history without
  the previous summary, no end summary — what every run recorded before issue 44 did.

RetroSum's experience bank conditions the summariser too: summariser lessons retrieved for the case
are shown here, under their own heading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grandrounds.handlers.agent.guard import HistoryTurn
from grandrounds.handlers.llm.errors import CaseFailure, LLMUnavailable
from grandrounds.handlers.llm.gateway import LLMGateway
from grandrounds.handlers.llm.recorder import Recorder
from grandrounds.store.event_types import AgentStep, AnswerGiven

SUMMARISE_SYSTEM = """You are the retrospective summariser of a clinical reasoning agent.
Re-read the agent's WHOLE history below, the earliest steps as carefully as the latest, and write a new
summary of what is known so far: the findings with their exact values, which tool said what, which
actions failed and why, and links between early and recent evidence that bear on the answer.
Write plain text, at most 8 short lines. Do not answer the question and do not invent findings."""

Context = Literal["both", "actor", "summariser"]
CONTEXTS: tuple[str, ...] = ("both", "actor", "summariser")
"""The published `retrospect_context`: who looks back over the whole history. `both` (RetroSum): the
actor keeps every raw turn and the summariser re-reads them all; `actor`: the actor keeps them, the
summariser reads only the steps since its last summary (a one-way summary); `summariser`: the
summariser re-reads them all, the actor sees the latest summary and only the turns after it."""

RECENT_HEADER = "## Retrospective summary (written after step {step}; the turns above are those since it)"
"""The summary's heading when the actor does not keep the history before it (`summariser`)."""


@dataclass(frozen=True)
class Retrospection:
    """How one case is summarised: the window, who looks back, and what the summariser reads."""

    every: int
    """w: a summary after every w-th step that is not the last; 0: none during the episode."""
    context: Context = "both"
    previous: bool = True
    """The summariser reads its previous summary (the published code's `last_summary`)."""
    final: bool = True
    """A summary after the episode ends (the published code's, which its reflection reads)."""


def legacy(every: int) -> Retrospection:
    """The agent loop's `--summary-every` (every policy but RetroSum, and runs before issue 44)."""
    return Retrospection(every, "both", previous=False, final=False)


NO_RETROSPECTION = Retrospection(0, previous=False, final=False)
"""No summaries: the FHIR loops for every policy but RetroSum (they had no summariser before issue 44)."""


def due(step: int, every: int, final: bool) -> bool:
    """A summary is written after step `step` when `every` divides it (and the loop goes on)."""
    return every > 0 and not final and step % every == 0


def case_brief(view) -> str:
    """What the summariser is told of the case: an MCQ case with its options, a FHIR task with its context."""
    if view.kind == "fhir":
        return (f"## FHIR task (type {view.task_type}, category: {view.category})\n{view.instruction}\n\n"
                f"## Context\n{view.context}")
    options = "\n".join(f"{k}) {v}" for k, v in view.options.items())
    return f"## Case (category: {view.category})\n{view.question}\n\nOptions:\n{options}"


def summariser_messages(view, history: list[HistoryTurn], lessons: list[str] | None = None,
                        previous: tuple[int, str] | None = None, first: int = 1,
                        final: bool = False) -> list[dict[str, str]]:
    """The case (without the actor's memory block), the summariser's own lessons, its previous summary
    (when it reads it), and the raw steps from `first` on (1 unless it reads only the recent ones)."""
    steps = "\n\n".join(f"### Step {i}\nAgent: {t.output}\nObservation: {t.observation}"
                        for i, t in enumerate(history[first - 1:], start=first))
    taught = ("## Lessons for the summariser from a similar past case\n"
              + "\n".join(f"- {x}" for x in lessons) + "\n\n") if lessons else ""
    last = f"## Previous summary (written after step {previous[0]})\n{previous[1]}\n\n" if previous else ""
    span = "Full history" if first == 1 else "Recent history"
    ask = ("The episode has ended: write the retrospective summary of the whole case." if final
           else f"Write the retrospective summary after step {len(history)}.")
    user = (f"{case_brief(view)}\n\n{taught}{last}"
            f"## {span} (steps {first}-{len(history)})\n{steps}\n\n{ask}")
    return [{"role": "system", "content": SUMMARISE_SYSTEM}, {"role": "user", "content": user}]


class Retrospector:
    """One case's retrospective summaries, for an agent loop: when one is due, what the summariser
    reads, what of the history the actor is shown. The loop raises `CaseFailure` on `LLMUnavailable`."""

    def __init__(self, gateway: LLMGateway, view, recorder: Recorder, spec: Retrospection,
                 lessons: list[str] | None = None):
        self.gateway, self.view, self.recorder, self.spec, self.lessons = gateway, view, recorder, spec, lessons
        self.summary: tuple[int, str] | None = None
        """(written after step, text) of the latest summary."""

    def actor_history(self, history: list[HistoryTurn]) -> list[HistoryTurn]:
        """The turns the actor is shown: all of them, or (`summariser`) those after the latest summary."""
        if self.spec.context == "summariser" and self.summary is not None:
            return history[self.summary[0]:]
        return history

    @property
    def header(self) -> str | None:
        """The summary's heading in the actor's prompt (None: the guard's, for a complete history)."""
        return RECENT_HEADER if self.spec.context == "summariser" else None

    async def _write(self, history: list[HistoryTurn], purpose: str, final: bool) -> str:
        previous = self.summary if self.spec.previous else None
        first = self.summary[0] + 1 if self.spec.context == "actor" and self.summary is not None else 1
        messages = summariser_messages(self.view, history, self.lessons, previous, first, final)
        return (await self.gateway.complete(messages, self.recorder, purpose)).text.strip()

    async def after_step(self, step: int, final: bool, history: list[HistoryTurn], steps: list[AgentStep]) -> None:
        """Write a summary after `step` when one is due; it joins the trajectory as a `summary` step.
        A model outage fails the case (`CaseFailure`), as it does at any step."""
        if not due(step, self.spec.every, final):
            return
        try:
            self.summary = (step, await self._write(history, f"summarise-step-{step}", False))
        except LLMUnavailable as exc:
            raise CaseFailure(f"model unavailable for the summary after step {step}: {exc}", steps) from None
        steps.append(AgentStep(kind="summary", content=self.summary[1]))

    async def closed(self, history: list[HistoryTurn], output: str, answer: AnswerGiven) -> AnswerGiven:
        """The answer, with the end-of-episode summary after its response when the spec asks for one
        (reflection reads it as the trajectory's latest summary). `output`: the model's last reply."""
        if not self.spec.final:
            return answer
        last = HistoryTurn(output, f"the episode ended: answer {answer.answer or '(none)'}")
        try:
            text = await self._write(history + [last], "summarise-final", True)
        except LLMUnavailable as exc:
            raise CaseFailure(f"model unavailable for the end-of-episode summary: {exc}", answer.steps) from None
        return answer.model_copy(update={"steps": [*answer.steps, AgentStep(kind="summary", content=text)]})
