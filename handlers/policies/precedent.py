"""`precedent`: the plain nearest-precedent baseline (not from a seed paper).

Memory is the past cases themselves with their confirmed answers: after feedback each case is
stored as an episode (no model call), and a new case is shown the k most similar past cases at or
above a cosine floor, rendered as precedents (findings, confirmed answer, what the agent answered).
The baseline a learning policy has to beat: it tells whether rules, valuation and reflection add
anything over recalling similar solved cases.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from grandrounds.handlers.policies.base import MemoryPolicy
from grandrounds.handlers.policies.config import PolicyBase
from grandrounds.handlers.policies.precedents import findings_of, precedent_line
from grandrounds.handlers.policies.render import render_prefix
from grandrounds.handlers.text import key_terms
from grandrounds.handlers.policies.evo_medagent.events import EpisodeStored
from grandrounds.handlers.policies.evo_medagent.memory import EvoMemory
from grandrounds.store.event_types import MemoryRetrieved, RetrievedEpisode


def bare_episode(episode_id: str, case: Any, answer: Any, gold: str, correct: bool,
                 trace: list[str] | None = None) -> EpisodeStored:
    """An episode kept as the case happened, with no reflection (summary and guideline empty): what the
    precedent and long-context baselines store. `trace`: the lines kept of the case (default none)."""
    options = getattr(case, "options", None) or {}
    return EpisodeStored(
        episode_id=episode_id, case_id=case.case_id, descriptor=case.question, trace=list(trace or []),
        answer=answer.answer, gold=gold, correct=correct, summary="", guideline="", trigger=key_terms(case.question),
        answer_text=options.get(answer.answer, ""), gold_text=options.get(gold, ""))


class PrecedentPolicy(PolicyBase):
    """Nearest precedents: the k most similar past cases with their confirmed answers."""

    name: Literal["precedent"] = "precedent"
    writing: bool = True
    """Store each case after feedback (false freezes memory: offline test mode)."""
    k: int = Field(1, ge=0)
    """Precedents shown per case. 1: given two precedents of different diagnoses, the local 1.5 B model
    followed the wrong one as often as the right one (benchmarks/bench_real_model.py)."""
    floor: float = 0.5
    """Cosine (question embeddings) below which a past case is not shown; the same floor as
    evo-medagent's `episode_floor` (see there for how it was found)."""
    name_wrong_answers: bool = False
    """As evo-medagent's: name the agent's wrong answer in a precedent (runs recorded before: true)."""
    rerank: int = Field(8, ge=0)
    """The nearest this many past cases by cosine (at or above the floor) are re-ranked by BM25 over
    their shared findings (handlers/text.py `TermIndex`) before the k are taken; 0: cosine order
    (runs recorded before this field)."""
    precedent_style: Literal[1, 2] = 2
    """2: a precedent says which option of this question its confirmed answer is
    (handlers/policies/precedents.py `option_note`); 1: the text only (runs recorded before)."""

    ablations: ClassVar[dict[str, dict[str, Any]]] = {"no-writing": {"writing": False},
                                                       "cosine-only": {"rerank": 0}}
    recorded_defaults: ClassVar[dict[str, Any]] = {"name_wrong_answers": True, "rerank": 0, "precedent_style": 1}


class PrecedentMemory(MemoryPolicy):
    config: PrecedentPolicy

    def retrieve(self, ctx, case, memory_seq):
        proj, cfg = ctx.projection, self.config
        mem: EvoMemory = proj.state.policy_memory  # the episodes part, shared with evo-medagent
        episodes: list[RetrievedEpisode] = []
        lines: list[str] = []
        if cfg.k and len(mem.episode_index):
            own = proj.own_cases(case.case_id)  # the case and its content twins
            query = ctx.retrieval_text(case.question, case.case_id)
            found = mem.nearest_episodes(proj.embed(query), own, cfg.floor, cfg.k, cfg.rerank, query)
            options = getattr(case, "options", None)
            for ep, rel in found:
                episodes.append(RetrievedEpisode(episode_id=ep.episode_id, source_case_id=ep.case_id, summary="",
                                                 guideline="", trigger=ep.trigger, relevance=round(float(rel), 6)))
                lines.append(precedent_line(findings_of(ep.descriptor), ep.gold_text or f"option {ep.gold}",
                                            ep.answer_text, ep.correct, "", cfg.name_wrong_answers,
                                            cfg.precedent_style, options))
        return MemoryRetrieved(memory_seq=memory_seq, episodes=episodes,
                               prefix=render_prefix([], [], episodes, lines))

    async def reflect(self, ctx, case, memory, answer, fb):
        if not self.writes:
            return None
        state: EvoMemory = ctx.projection.state.policy_memory
        ctx.writer.emit(bare_episode(f"ep-{state.episodes_added:05d}", case, answer, case.answer, fb.correct),
                        case_id=case.case_id)
        return None
