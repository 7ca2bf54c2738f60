"""RetroSum's experience bank as a projection part (store/policy_memory.py).

A pure fold of `experience.stored`: each experience is embedded by its patient context and
added to a cosine index; labels follow event order, so search ties break by age. The part
also remembers which cases each experience came from (the leakage guard) and which cases
this run itself has already reflected on (seq ≥ 0; seeded experiences arrive with negative
seqs), so a resumed case never stores its experience twice.
"""

from __future__ import annotations

from typing import Iterable
from grandrounds.store.case_content import own_set
from dataclasses import dataclass

import numpy as np

from grandrounds.store.events import EventPayload
from grandrounds.handlers.policies.retrosum.events import ExperienceStored, Lesson
from grandrounds.store.policy_memory import Embed, register_part
from grandrounds.store.vector_index import VectorIndex


@dataclass(frozen=True)
class Experience:
    experience_id: str
    source_case_id: str
    context: str
    actor_lessons: tuple[Lesson, ...]
    summariser_lessons: tuple[Lesson, ...]
    correct: bool
    seq: int
    """Seq of the event that stored it (negative when it came from a seeded run)."""


class ExperienceMemory:
    def __init__(self, dim: int, exact_limit: int = 4096):
        self.index = VectorIndex(dim, exact_limit=exact_limit)
        self.by_label: list[Experience] = []
        self.labels_of_case: dict[str, list[int]] = {}
        self.reflected_here: set[str] = set()
        """Cases whose experience this run stored itself (not seeded ones)."""
        self.actor_lessons = 0
        self.summariser_lessons = 0

    def __len__(self) -> int:
        return len(self.by_label)

    def apply(self, seq: int, payload: EventPayload, embed: Embed) -> None:
        if not isinstance(payload, ExperienceStored):
            return
        exp = Experience(payload.experience_id, payload.source_case_id, payload.context,
                         tuple(payload.actor_lessons), tuple(payload.summariser_lessons), payload.correct, seq)
        label = self.index.add(embed(payload.context))
        assert label == len(self.by_label)
        self.by_label.append(exp)
        self.labels_of_case.setdefault(exp.source_case_id, []).append(label)
        self.actor_lessons += len(exp.actor_lessons)
        self.summariser_lessons += len(exp.summariser_lessons)
        if seq >= 0:
            self.reflected_here.add(exp.source_case_id)

    def nearest(self, query: np.ndarray, k: int, exclude_case: str | Iterable[str]) -> list[tuple[Experience, float]]:
        """The k experiences closest to `query` by cosine, best first (ties: the older), never one
        derived from `exclude_case` (leakage guard). Searches k + that case's own count, so the
        guard never costs a result."""
        if k <= 0 or not self.by_label:
            return []
        excluded = own_set(exclude_case)  # the case and its content twins
        own = sum(len(self.labels_of_case.get(c, ())) for c in excluded)
        hits = self.index.search(query, k + own)
        out = [(self.by_label[label], cos) for label, cos in hits
               if self.by_label[label].source_case_id not in excluded]
        return out[:k]

    def audit_items(self) -> list[dict]:
        """Every experience with its lessons, for `grandrounds audit items`."""
        return [{"kind": "experience", "id": x.experience_id, "status": "stored", "source_case_id": x.source_case_id,
                 "context": x.context, "correct": x.correct, "created_seq": x.seq,
                 "actor_lessons": [lesson.text for lesson in x.actor_lessons],
                 "summariser_lessons": [lesson.text for lesson in x.summariser_lessons]} for x in self.by_label]

    def counts(self) -> dict:
        return {"experiences": len(self.by_label), "actor_lessons": self.actor_lessons,
                "summariser_lessons": self.summariser_lessons}


register_part("retrosum", ExperienceMemory)
