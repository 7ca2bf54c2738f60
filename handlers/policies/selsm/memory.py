"""SELSM's memory as a projection part: records R = (query, transitions) and the two-level index.

Task level: one query embedding per record (`record_index`). Transition level: per record,
the state and skill embeddings of its transitions as matrices (stage 2 scores a handful of
records, so a matrix product over their rows is exact and cheap), plus one global index over
every transition state for the no-two-stage ablation. Records are never removed, so index
labels are positions in `records` / `state_owner` (insertion = event order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grandrounds.store.event_types import RunStarted
from grandrounds.store.events import EventPayload
from grandrounds.store.policy_memory import Embed, register_part
from grandrounds.handlers.policies.selsm.events import RecordStored, SkillRejected, StoredTransition, TrajectoryJudged, render_skill
from grandrounds.handlers.policies.selsm.state_view import WHOLE, embedded_state
from grandrounds.store.vector_index import VectorIndex


@dataclass
class SelsmRecord:
    record_id: str
    source_case_id: str
    query: str
    seq: int
    """Seq of the `selsm.record.stored` event (negative when seeded from another run)."""
    transitions: list[StoredTransition]
    states: np.ndarray
    """v_{s_t} for each transition, one unit row each."""
    skills: np.ndarray
    """v_{e_t} for each transition (the paper's skill embedding; indexed, not used for ranking)."""
    rounds: np.ndarray


@dataclass
class SelsmMemory:
    dim: int
    exact_limit: int = 4096
    records: list[SelsmRecord] = field(default_factory=list)
    by_case: dict[str, list[int]] = field(default_factory=dict)
    """Source case id -> positions of its records (the leakage guard skips them)."""
    state_owner: list[tuple[int, int]] = field(default_factory=list)
    """`state_index` label -> (record position, transition position)."""
    success_paradigms: int = 0
    correction_axioms: int = 0
    rejected: int = 0
    judged: int = 0
    state_view: int = WHOLE
    """How states are embedded (state_view.py): the run's `SelsmPolicy.state_view`, read from its
    `run.started` (absent there: a run recorded before the field, which embedded them whole)."""

    def __post_init__(self) -> None:
        self.record_index = VectorIndex(self.dim, exact_limit=self.exact_limit)
        self.state_index = VectorIndex(self.dim, exact_limit=self.exact_limit)

    def apply(self, seq: int, payload: EventPayload, embed: Embed) -> None:
        if isinstance(payload, RunStarted):
            self.state_view = int(payload.policy.get("state_view", WHOLE))
        elif isinstance(payload, RecordStored):
            self._store(seq, payload, embed)
        elif isinstance(payload, SkillRejected):
            self.rejected += 1
        elif isinstance(payload, TrajectoryJudged):
            self.judged += 1

    def _store(self, seq: int, rec: RecordStored, embed: Embed) -> None:
        pos = len(self.records)
        n = len(rec.transitions)
        states = np.zeros((n, self.dim), dtype=np.float32)
        skills = np.zeros((n, self.dim), dtype=np.float32)
        for j, t in enumerate(rec.transitions):
            states[j] = embed(embedded_state(t.state, self.state_view))
            skills[j] = embed(render_skill(t.skill))
            if t.skill.label == "+":
                self.success_paradigms += 1
            else:
                self.correction_axioms += 1
        self.records.append(SelsmRecord(rec.record_id, rec.source_case_id, rec.query, seq, list(rec.transitions),
                                        states, skills, np.array([t.round for t in rec.transitions], dtype=np.int64)))
        label = self.record_index.add(embed(rec.query))
        assert label == pos, "record labels are positions: records are never removed"
        self.by_case.setdefault(rec.source_case_id, []).append(pos)
        for j in range(n):
            self.state_index.add(states[j])
            self.state_owner.append((pos, j))

    def own_transitions(self, case_id: str) -> int:
        return sum(len(self.records[p].transitions) for p in self.by_case.get(case_id, ()))

    def audit_items(self) -> list[dict[str, Any]]:
        """Every record with its transitions' skills, for `grandrounds audit items`."""
        return [{"kind": "selsm-record", "id": r.record_id, "status": "stored", "source_case_id": r.source_case_id,
                 "query": r.query, "created_seq": r.seq,
                 "transitions": [t.model_dump(mode="json") for t in r.transitions]} for r in self.records]

    def counts(self) -> dict[str, Any]:
        return {"selsm_records": len(self.records), "selsm_transitions": len(self.state_owner),
                "selsm_success_paradigms": self.success_paradigms,
                "selsm_correction_axioms": self.correction_axioms,
                "selsm_rejected_skills": self.rejected, "selsm_trajectories_judged": self.judged}


register_part("selsm", SelsmMemory)
