"""RetroSum retrospective summarisation (AgentEHR; DESIGN §6).

Every `w` steps the summariser re-reads the WHOLE raw history — every model output and every
observation since step 1, untrimmed, whatever the context guard does to the actor's prompt —
and writes a new summary that links early and recent findings. It is a separate model call
through the gateway (purpose `summarise-step-<j>`), so it is recorded as an `llm.exchange`
before it is used and a recorded run serves it like any other exchange. The summary replaces
the previous one (the paper's summariser re-reads the raw history, not its own past summary,
so an early mistake is not compounded). The actor then sees the raw history plus the latest
summary (`guard.render(summary=...)`): rendering only, the trajectory keeps everything and
gains an `AgentStep(kind="summary")` after the step the summary was written at.

RetroSum's experience bank (the `retrosum` memory policy) conditions the summariser too:
summariser lessons retrieved for the case are shown here, under their own heading.
"""

from __future__ import annotations

from grandrounds.handlers.agent.guard import HistoryTurn
from grandrounds.handlers.cases import CaseView
from grandrounds.handlers.llm.gateway import LLMGateway, Reply
from grandrounds.handlers.llm.recorder import Recorder

SUMMARISE_SYSTEM = """You are the retrospective summariser of a clinical reasoning agent.
Re-read the agent's WHOLE history below, the earliest steps as carefully as the latest, and write a new
summary of what is known so far: the findings with their exact values, which tool said what, which
actions failed and why, and links between early and recent evidence that bear on the answer.
Write plain text, at most 8 short lines. Do not answer the question and do not invent findings."""


def due(step: int, every: int, final: bool) -> bool:
    """A summary is written after step `step` when `every` divides it (and the loop goes on)."""
    return every > 0 and not final and step % every == 0


def summariser_messages(view: CaseView, history: list[HistoryTurn],
                        lessons: list[str] | None = None) -> list[dict[str, str]]:
    """The case (without the actor's memory block), the summariser's own lessons, every raw step."""
    options = "\n".join(f"{k}) {v}" for k, v in view.options.items())
    steps = "\n\n".join(f"### Step {i}\nAgent: {t.output}\nObservation: {t.observation}"
                        for i, t in enumerate(history, start=1))
    taught = ("## Lessons for the summariser from a similar past case\n"
              + "\n".join(f"- {x}" for x in lessons) + "\n\n") if lessons else ""
    user = (f"## Case (category: {view.category})\n{view.question}\n\nOptions:\n{options}\n\n{taught}"
            f"## Full history (steps 1-{len(history)})\n{steps}\n\n"
            f"Write the retrospective summary after step {len(history)}.")
    return [{"role": "system", "content": SUMMARISE_SYSTEM}, {"role": "user", "content": user}]


async def summarise(gateway: LLMGateway, view: CaseView, history: list[HistoryTurn], recorder: Recorder,
                    lessons: list[str] | None = None) -> Reply:
    return await gateway.complete(summariser_messages(view, history, lessons), recorder,
                                  f"summarise-step-{len(history)}")
