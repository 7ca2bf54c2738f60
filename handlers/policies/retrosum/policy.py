"""RetroSum's experience bank, stage-facing (seed 002; DESIGN §6).

Retrieve: embed the case's patient context, take the top-1 experience of another case at
cosine ≥ 0.5, and show its actor lessons to the actor (the memory prefix, MemoryItem kind
`experience`) and its summariser lessons to the retrospective summariser (items with
detail["audience"] = "summariser", which the openai loop hands to the summariser and keeps
out of the actor's prompt). Reflect: one model task distils both lesson lists from the
trajectory and the outcome; they are stored as `experience.stored`.

Candidate alignment (free text mapped to an official option before finishing) is the agent
loop's: handlers/agent/protocol.py aligns a tag-less final answer to an option.
"""

from __future__ import annotations

from typing import Iterable
from grandrounds.handlers.agent.protocol import mentioned_options
from grandrounds.handlers.cases import Case
from grandrounds.handlers.policies.base import SUMMARISER, MemoryPolicy, Retrospection, ask_or_fail
from grandrounds.handlers.policies.fhir_lessons import fhir_terms
from grandrounds.handlers.policies.precedents import review_text
from grandrounds.handlers.policies.render import render_items
from grandrounds.handlers.policies.retrosum.config import RetroSumPolicy
from grandrounds.handlers.policies.retrosum.lessons import ExperienceDraft, LessonDraft, lesson_task, patient_context
from grandrounds.handlers.text import content_tokens, key_terms
from grandrounds.store.event_types import AnswerGiven, FeedbackRecorded, MemoryItem, MemoryRetrieved
from grandrounds.handlers.policies.retrosum.events import ExperienceStored, Lesson
from grandrounds.handlers.policies.retrosum.memory import Experience, ExperienceMemory
from grandrounds.store.llm_events import CaseFailed

ACTOR = "actor"
ACTOR_TITLE = "Lessons from a similar past case"


def _r6(x: float) -> float:
    return round(float(x), 6)


def bank(ctx) -> ExperienceMemory:
    part = ctx.projection.state.policy_memory
    assert isinstance(part, ExperienceMemory), "retrosum run without its experience memory part"
    return part


def select(part: ExperienceMemory, query, cfg: RetroSumPolicy, case_id: str | Iterable[str]) -> list[tuple[Experience, float]]:
    """The top-k experiences of other cases whose patient context is at least `min_similarity` close."""
    return [(exp, cos) for exp, cos in part.nearest(query, cfg.top_k, exclude_case=case_id)
            if cos >= cfg.min_similarity]


def experience_items(exp: Experience, relevance: float, cfg: RetroSumPolicy) -> list[MemoryItem]:
    """One item per lesson the config lets through: actor lessons first, then summariser lessons."""
    rel = _r6(relevance)
    base = {"experience_id": exp.experience_id, "source_case_id": exp.source_case_id, "correct": exp.correct}
    items: list[MemoryItem] = []
    if cfg.actor_lessons:
        items += [MemoryItem(kind="experience", item_id=f"{exp.experience_id}-a{i}", text=lesson.text,
                             trigger=list(lesson.trigger), relevance=rel, score=rel,
                             detail={**base, "audience": ACTOR})
                  for i, lesson in enumerate(exp.actor_lessons, 1)]
    if cfg.summariser_lessons:
        items += [MemoryItem(kind="experience", item_id=f"{exp.experience_id}-s{i}", text=lesson.text,
                             trigger=[], relevance=rel, score=rel, detail={**base, "audience": SUMMARISER})
                  for i, lesson in enumerate(exp.summariser_lessons, 1)]
    return items


def names_an_option(item: MemoryItem, case: Case) -> bool:
    """Whether an actor lesson names one of this case's options: its full text, its letter, or a word of
    it (5 letters or more) that this case's question does not use ("pneumothorax" for "Tension
    pneumothorax", unless the vignette says it). Such a lesson from another presentation acts as the
    answer for a small model (see `answer_lessons_floor`). Summariser lessons go to the summariser,
    not the actor, and are never withheld."""
    options = getattr(case, "options", None)  # FHIR tasks have none
    if item.detail.get("audience") == SUMMARISER or not options:
        return False
    if mentioned_options(item.text, options):
        return True
    answer_words = {w for option in options.values() for w in content_tokens(option) if len(w) >= 5}
    return bool((answer_words - content_tokens(case.question)) & content_tokens(item.text))


def reviewed(drafts: list[LessonDraft], case: Case, cfg: RetroSumPolicy) -> list[LessonDraft]:
    """The actor lessons that may become memory: with `review_lessons`, an MCQ case's lessons that pass
    the review gate (precedents.review_text against its options and confirmed answer)."""
    options = getattr(case, "options", None)
    if not (cfg.review_lessons and options):
        return list(drafts)
    return [d for d in drafts if review_text(d.text, case.question, options, case.answer) is None]


def _lessons(drafts: list[LessonDraft], limit: int, default_trigger: list[str] | None) -> list[Lesson]:
    """Non-empty lessons, at most `limit`, duplicates dropped. Actor lessons without a trigger get
    the case's key terms; summariser lessons carry none (`default_trigger` None)."""
    out: list[Lesson] = []
    seen: set[str] = set()
    for d in drafts:
        text = " ".join(d.text.split())
        if not text or text in seen:
            continue
        seen.add(text)
        trigger = [] if default_trigger is None else ([t.strip().lower() for t in d.trigger if t.strip()]
                                                      or default_trigger)
        out.append(Lesson(text=text, trigger=trigger))
        if len(out) == limit:
            break
    return out


class RetroSumMemory(MemoryPolicy):
    config: RetroSumPolicy

    def retrieve(self, ctx, case: Case, memory_seq: int) -> MemoryRetrieved:
        cfg = self.config
        part = bank(ctx)
        items: list[MemoryItem] = []
        if len(part) and cfg.top_k and (cfg.actor_lessons or cfg.summariser_lessons):
            query = ctx.projection.embed(patient_context(ctx.retrieval_text(case.question, case.case_id)))
            for exp, cos in select(part, query, cfg, ctx.projection.own_cases(case.case_id)):
                items += [item for item in experience_items(exp, cos, cfg)
                          if cos >= cfg.answer_lessons_floor or not names_an_option(item, case)]
        actor = [i for i in items if i.detail.get("audience") != SUMMARISER]
        return MemoryRetrieved(memory_seq=memory_seq, items=items, prefix=render_items([(ACTOR_TITLE, actor)]))

    def retrospection(self, ctx, view, memory: MemoryRetrieved) -> Retrospection | None:
        """The paper's retrospective summaries (None for a run recorded before issue 44: the loop's own)."""
        cfg = self.config
        if cfg.summary_every is None:
            return None
        return Retrospection(cfg.summary_every, cfg.retrospect_context, previous=True, final=cfg.end_summary)

    async def reflect(self, ctx, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                      fb: FeedbackRecorded) -> CaseFailed | None:
        cfg = self.config
        part = bank(ctx)
        if not self.writes or (not fb.correct and not cfg.learn_from_failures):
            return None
        if case.case_id in part.reflected_here:
            return None  # resumed after this case's experience was stored: never store it twice
        task = lesson_task(case, answer, fb, memory.items, cfg.max_actor_lessons, cfg.max_summariser_lessons)
        draft = await ask_or_fail(ctx, case.case_id, "reflect", task)
        if isinstance(draft, CaseFailed):
            return draft
        assert isinstance(draft, ExperienceDraft)
        terms = fhir_terms(case.instruction) if case.kind == "fhir" else key_terms(case.question)
        actor = _lessons(reviewed(draft.actor_lessons, case, cfg), cfg.max_actor_lessons, terms)
        summariser = _lessons(draft.summariser_lessons, cfg.max_summariser_lessons, None)
        if not (actor or summariser):
            return None  # nothing worth keeping: an empty experience would only crowd out others
        ctx.writer.emit(ExperienceStored(
            experience_id=f"exp-{len(part):05d}", source_case_id=case.case_id,
            context=patient_context(case.question), actor_lessons=actor, summariser_lessons=summariser,
            answer=answer.answer, gold=case.answer, correct=fb.correct), case_id=case.case_id)
        return None
