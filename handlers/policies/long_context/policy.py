"""`long-context`: show the most recent past cases and their outcomes, newest first, up to a budget.

Retrieve. Walk the kept cases from the most recent back (memory.py `RecentCases.newest_first`), skipping
the case itself and its content twins (`MemoryProjection.own_cases`: a renamed or re-shuffled copy, a
training case a frozen split repeats), and render each as one line: its question, its options, the
agent's answer and whether it was right, the confirmed answer. Lines are taken whole, in that order,
while the section stays within the budget (`context_tokens` × `chars_per_token` characters); the first
line that would overflow ends the section, so what is shown is always an unbroken run of the most recent
cases. Only when the most recent case alone is over the budget is its question cut, at a word boundary,
to fit (the outcome is the part worth keeping). A pure function of the kept cases and the config: no
similarity, no model call, no clock.

Write. After feedback (stage 4, gold visible) the case is kept as an `episode.stored` event, with no
model call. A case enters memory only here, after its own `feedback.recorded`, so a past case's confirmed
answer is never shown before its feedback; a case still in flight (`--lag`) is not shown at all. The
event is de-identified by the writer like every memory event, so another patient reads placeholders
and withheld words (handlers/deidentify.py), never this patient's identifiers.

What was shown is recorded in `memory.retrieved`: one `RetrievedEpisode` per past case (its episode and
source case; relevance 0, since nothing was scored) and the rendered prefix. The episode's `guideline`
is the confirmed-answer sentence the prompt shows for it: what the `sim` backbone reads from an episode
(it follows an episode whose trigger overlaps the case and whose guideline names one of its options; the
agent's wrong answer is left out of it, or the simulator could follow that instead).
"""

from __future__ import annotations

from grandrounds.handlers.policies.base import MemoryPolicy
from grandrounds.handlers.policies.long_context.config import LongContextPolicy
from grandrounds.handlers.policies.long_context.memory import PastCase, RecentCases
from grandrounds.handlers.policies.precedent import bare_episode
from grandrounds.handlers.policies.render import render_prefix
from grandrounds.store.event_types import MemoryRetrieved, RetrievedEpisode

SECTION = "## Recent past cases (most recent first; each with its own options and its outcome)"
"""The section's title; not counted in the budget (it is there, or the whole section is not)."""

CUT = " …"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _named(letter: str, text: str) -> str:
    return f"{letter} ({_flat(text)})" if text else letter


def confirmed(past: PastCase) -> str:
    """The sentence naming the past case's confirmed answer."""
    return f"Confirmed answer: {_named(past.gold, past.gold_text)}."


def outcome(past: PastCase) -> str:
    """What happened: the agent's answer, whether it was right, the confirmed answer (in the letters of
    the past case's own options, with their texts: letters are shuffled between cases)."""
    if not past.answer_text:
        agent = "The agent gave no valid answer"
    else:
        agent = f"The agent answered {_named(past.answer, past.answer_text)}: {'correct' if past.correct else 'wrong'}"
    return f"{agent}. {confirmed(past)}"


def case_line(n: int, past: PastCase, question: str | None = None) -> str:
    """One past case as the prompt shows it; `question`: its (cut) question instead of the kept one."""
    options = "; ".join(_flat(o) for o in past.options)
    head = f"- Past case {n}: {_flat(past.question if question is None else question)}"
    return f"{head} Options: {options}. {outcome(past)}" if options else f"{head} {outcome(past)}"


def _fit_question(n: int, past: PastCase, budget: int) -> str | None:
    """The case's line with its question cut at a word boundary to fit `budget` characters, or None when
    not even an empty question fits. Deterministic: the longest word-boundary prefix that fits."""
    frame = len(case_line(n, past, ""))
    room = budget - frame - len(CUT)
    if room < 0:
        return None
    words = _flat(past.question).split(" ")
    kept: list[str] = []
    used = 0
    for w in words:
        extra = len(w) + (1 if kept else 0)
        if used + extra > room:
            break
        kept.append(w)
        used += extra
    return case_line(n, past, " ".join(kept) + CUT)


def select(mem: RecentCases, own: frozenset[str], cfg: LongContextPolicy) -> list[tuple[PastCase, str]]:
    """The past cases to show with their lines, newest first, within the budget (see the module doc)."""
    budget = int(cfg.context_tokens * cfg.chars_per_token)
    shown: list[tuple[PastCase, str]] = []
    used = 0
    for past in mem.newest_first(own):
        if cfg.max_cases and len(shown) >= cfg.max_cases:
            break
        n = len(shown) + 1
        line = case_line(n, past)
        cost = len(line) + (1 if shown else 0)  # lines are joined by newlines
        if used + cost > budget:
            if not shown:  # the most recent case alone is over the budget: its question is cut to fit
                cut = _fit_question(n, past, budget)
                if cut is not None:
                    shown.append((past, cut))
            break
        shown.append((past, line))
        used += cost
    return shown


class LongContextMemory(MemoryPolicy):
    config: LongContextPolicy

    def retrieve(self, ctx, case, memory_seq):
        proj = ctx.projection
        mem: RecentCases = proj.state.policy_memory
        shown = select(mem, proj.own_cases(case.case_id), self.config) if mem.cases else []
        episodes = [RetrievedEpisode(episode_id=p.episode_id, source_case_id=p.case_id, summary="",
                                     guideline=confirmed(p), trigger=p.trigger, relevance=0.0) for p, _ in shown]
        lines = [line for _, line in shown]
        prefix = render_prefix([], [], [])
        if lines:
            prefix = "\n".join([prefix, SECTION, *lines])
        return MemoryRetrieved(memory_seq=memory_seq, episodes=episodes, prefix=prefix)

    async def reflect(self, ctx, case, memory, answer, fb):
        if not self.writes:
            return None
        options = getattr(case, "options", None) or {}
        mem: RecentCases = ctx.projection.state.policy_memory
        ctx.writer.emit(bare_episode(f"ep-{mem.kept:05d}", case, answer, fb.gold, fb.correct,
                                     trace=[f"{k}) {v}" for k, v in options.items()]), case_id=case.case_id)
        return None
