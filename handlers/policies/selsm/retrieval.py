"""Query-anchored two-stage retrieval (seed 000 §2.4), as pure functions of the memory part.

Stage 1 (task level): the top Q records by cosine between the case's query and each record's
query. Stage 2 (transition level): their transitions pooled, scored by cosine between the
current state and each transition's state, those below θ dropped, the rest ranked by
(score, round index) descending — ties in relevance favour later, more informative rounds —
and the top M returned. Remaining ties go to the earlier record, then the earlier
transition, so the order is a pure function of memory. Scores are exact cosines of integer
vectors (store/vectors.py), rounded to 6 decimals before they are compared, so the ranking (and the
bytes of what is recorded) does not depend on the CPU.

Without two-stage retrieval (ablation) the transitions come from all records by state
cosine alone: the state polysemy the paper's stage 1 exists to resolve.

The leakage guard is here: records distilled from the case being answered are never candidates.
"""

from __future__ import annotations

from typing import Iterable
from grandrounds.store.case_content import own_set
from dataclasses import dataclass

import numpy as np

from grandrounds.handlers.policies.selsm.events import StoredTransition
from grandrounds.handlers.policies.selsm.memory import SelsmMemory, SelsmRecord
from grandrounds.store.vectors import cosines


def _r6(x: float) -> float:
    return round(float(x), 6)


def _cosines(rows: np.ndarray, vec: np.ndarray) -> np.ndarray:
    return cosines(rows, vec)  # exact: integer vectors (store/vectors.py)


@dataclass(frozen=True)
class TransitionHit:
    record: SelsmRecord
    position: int
    """Index of the transition within its record."""
    state_score: float
    """σ_j: cosine between the current state and the transition's state (6 decimals)."""
    query_score: float | None
    """σ^(q) of its record in stage 1 (None without two-stage retrieval)."""

    @property
    def transition(self) -> StoredTransition:
        return self.record.transitions[self.position]


def candidate_records(mem: SelsmMemory, query_vec: np.ndarray, top_q: int,
                      case_id: str | Iterable[str]) -> list[tuple[int, float]]:
    """Stage 1: (record position, query cosine) of the top Q records, best first; never the case's own
    (nor those of a case of the same content: `case_id` may be the set `MemoryProjection.own_cases`)."""
    own = {p for c in own_set(case_id) for p in mem.by_case.get(c, ())}
    hits = mem.record_index.search(query_vec, top_q + len(own))
    return [(label, _r6(score)) for label, score in hits if label not in own][:top_q]


def rank(candidates: list[TransitionHit], theta: float, top_m: int) -> list[TransitionHit]:
    """Drop σ < θ, rank by (σ, round) descending; ties: earlier record, then earlier transition."""
    kept = [h for h in candidates if h.state_score >= theta]
    kept.sort(key=lambda h: (-h.state_score, -h.transition.round, h.record.seq, h.position))
    return kept[:top_m]


def two_stage(mem: SelsmMemory, query_vec: np.ndarray, state_vec: np.ndarray, case_id: str | Iterable[str],
              top_q: int,
              theta: float, top_m: int, candidates: list[tuple[int, float]] | None = None) -> list[TransitionHit]:
    """The paper's retrieval: stage 1 anchors on the query, stage 2 ranks the pooled transitions.
    `candidates`: stage 1's result when the caller already has it (it depends on the query only)."""
    pooled: list[TransitionHit] = []
    if candidates is None:
        candidates = candidate_records(mem, query_vec, top_q, case_id)
    for pos, q_score in candidates:
        rec = mem.records[pos]
        for j, s in enumerate(_cosines(rec.states, state_vec)):
            pooled.append(TransitionHit(rec, j, _r6(s), q_score))
    return rank(pooled, theta, top_m)


def state_only(mem: SelsmMemory, state_vec: np.ndarray, case_id: str | Iterable[str], theta: float, top_m: int,
               pool: int) -> list[TransitionHit]:
    """The no-two-stage ablation: the nearest transitions by state cosine across all records."""
    pooled: list[TransitionHit] = []
    own = own_set(case_id)
    for label, score in mem.state_index.search(state_vec, pool + sum(mem.own_transitions(c) for c in own)):
        pos, j = mem.state_owner[label]
        rec = mem.records[pos]
        if rec.source_case_id not in own:  # leakage guard
            pooled.append(TransitionHit(rec, j, _r6(score), None))
    return rank(pooled[:pool], theta, top_m)
