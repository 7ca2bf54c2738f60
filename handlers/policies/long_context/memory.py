"""The `long-context` baseline's memory as a projection part: the past cases, in the order they were kept.

Memory is written as `episode.stored` events (handlers/policies/evo_medagent/events.py), the event the
`precedent` baseline writes, so a kept case takes the same path as every other memory item: the writer
de-identifies it before the projection sees it (handlers/context.py `EventWriter.emit`), the store seals
its case text per subject (store/sealing.py: `descriptor`, `trace`), an erasure removes it, and audit
lists it as an episode. For this policy the event's `trace` holds the case's options as the agent read
them (`A) text`, one per line): the prompt shows a past case whole, options included, and letters mean
something only next to their own options.

`RecentCases` is a pure fold of those events (no index, no embedding: nothing is searched), so a rebuild
from the log equals the live part; insertion order is the order the cases were kept (case order: the
in-order pass learns in case order; a seeded memory's cases come first, `memory.seeded`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from grandrounds.handlers.policies.evo_medagent import events as evo
from grandrounds.store.events import EventPayload
from grandrounds.store.policy_memory import Embed, register_part


@dataclass
class PastCase:
    episode_id: str
    case_id: str
    question: str
    options: list[str]
    """`A) text` lines (the event's `trace`), de-identified."""
    answer: str
    answer_text: str
    gold: str
    gold_text: str
    correct: bool
    trigger: list[str]
    stored_seq: int


@dataclass
class RecentCases:
    cases: dict[str, PastCase] = field(default_factory=dict)
    """episode id -> the kept case, oldest first."""
    kept: int = 0
    """Cases ever kept (seeded ones included): numbers the next episode id."""

    def apply(self, seq: int, payload: EventPayload, embed: Embed) -> None:
        if isinstance(payload, evo.EpisodeStored):
            self.cases[payload.episode_id] = PastCase(
                payload.episode_id, payload.case_id, payload.descriptor, list(payload.trace), payload.answer,
                payload.answer_text, payload.gold, payload.gold_text, payload.correct, list(payload.trigger), seq)
            self.kept += 1

    def newest_first(self, own: frozenset[str] | set[str]) -> Iterator[PastCase]:
        """The kept cases from the most recent back, skipping those of `own` (the leakage guard: the case
        itself and every case of the same content)."""
        for past in reversed(self.cases.values()):
            if past.case_id not in own:
                yield past

    def counts(self) -> dict[str, Any]:
        return {"past_cases": len(self.cases)}


def new_part(dim: int, exact_limit: int) -> RecentCases:
    return RecentCases()  # no vectors: dim and the exact-search limit do not apply


register_part("long-context", new_part)
