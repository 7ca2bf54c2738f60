"""Events of RetroSum's experience bank (seed 002; DESIGN §6).

One experience per case, as in the published code's `MemoryEntry`: the case's patient
context (the text whose embedding keys the bank), the two lesson lists distilled from its
trajectory and outcome, and the outcome itself. The vector is not in the event: the fold
embeds `context` with the run's embedder, so a bank written under one embedder (or
backbone) is re-keyed correctly when another run starts from it (`memory.seeded`).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.store.events import EventPayload, event


class Lesson(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    """The lesson as shown to the actor or the summariser."""
    trigger: list[str] = Field(default_factory=list)
    """Key terms the lesson applies to (the sim backbone matches them against a case). Empty for
    summariser lessons: they are for the summariser, never an answer for the actor to follow."""


@event("experience.stored")
class ExperienceStored(EventPayload):
    carries_memory: ClassVar[bool] = True

    experience_id: str
    """`exp-NNNNN`, numbered in the order experiences were stored in the run that wrote them."""
    source_case_id: str
    """The case the lessons were distilled from (the leakage guard reads it)."""
    context: str
    """The patient context the experience is keyed by; for MCQ cases the question text (the
    vignette), which is everything the agent knows about the patient before acting."""
    actor_lessons: list[Lesson] = Field(default_factory=list)
    """Reasoning lessons for the actor (published code: `reasoning_memory_items`)."""
    summariser_lessons: list[Lesson] = Field(default_factory=list)
    """Gap lessons for the retrospective summariser (`summary_memory_items`)."""
    answer: str
    """The option letter the agent gave."""
    gold: str
    """The correct option letter (reflection runs after feedback, so it is legitimately known)."""
    correct: bool
