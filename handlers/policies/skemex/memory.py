"""SkeMex's skill repository as a projection part: the fold of the `skill.*` events.

Skills live in branch buckets (general; task-level per category; action-level per tool),
each with its own cosine index holding the retrievable (active and mature) skills. The
fold also keeps the learning window's trajectories, the window counter and the category
reward baselines, so a resumed or rebuilt run continues exactly where the live one was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grandrounds.handlers.policies.skemex import events as sk
from grandrounds.store.events import EventPayload
from grandrounds.store.policy_memory import Embed, register_part
from grandrounds.store.vector_index import VectorIndex

LIVE = ("active", "mature")
"""Statuses retrieval may show."""
PREFIX = {"general": "g", "task": "t", "action": "a"}


def bucket_of(branch: str, category: str | None, tool: str | None) -> str:
    """The capacity/merge/index bucket: `general`, `task:<category>`, `action:<tool>`."""
    if branch == "task":
        return f"task:{category}"
    if branch == "action":
        return f"action:{tool}"
    return "general"


def skill_key_text(body: sk.SkillBody) -> str:
    """What a skill is embedded as: when it applies and what it says to do."""
    return f"{body.description} {body.applicable_conditions} {body.core_action}"


@dataclass
class Skill:
    skill_id: str
    branch: str
    category: str | None
    tool: str | None
    body: sk.SkillBody
    created_seq: int
    status: str = "draft"  # draft | active | mature | deprecated | archived
    utility: float = 0.5
    version: int = 1
    derived_from: list[str] = field(default_factory=list)
    """Cases whose trajectories created or changed this skill (the leakage guard reads it)."""
    usage: int = 0
    """Adoptions (adopted+ and adopted−) credited by utility updates."""
    successes: int = 0
    """adopted+ adoptions."""
    failures: int = 0
    last_adopted_window: int | None = None
    merged_into: str | None = None
    vec: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def bucket(self) -> str:
        return bucket_of(self.branch, self.category, self.tool)

    @property
    def live(self) -> bool:
        return self.status in LIVE


@dataclass
class Baseline:
    ema: float
    n: int = 0


class SkillMemory:
    def __init__(self, dim: int, exact_limit: int = 4096):
        self.dim = dim
        self.exact_limit = exact_limit
        self.skills: dict[str, Skill] = {}
        self.indexes: dict[str, VectorIndex] = {}
        self.label_of: dict[str, int] = {}
        self.by_label: dict[str, dict[int, str]] = {}
        self.counters: dict[str, int] = {b: 0 for b in PREFIX}
        self.window = 0
        """Index of the open learning window (= windows closed so far)."""
        self.buffer: list[sk.TrajectoryRecorded] = []
        """The open window's trajectories, in arrival order."""
        self.recorded_cases: set[str] = set()
        self.assessments: dict[str, sk.TrajectoryAssessed] = {}
        """Pass-1 results of the open window, by case id."""
        self.baselines: dict[str, Baseline] = {}
        self.governed_window: int = -1
        """`window` of the last governance pass."""

    # --- queries -------------------------------------------------------------------------

    def next_id(self, branch: str) -> str:
        return f"{PREFIX[branch]}{self.counters[branch]:06d}"

    def in_bucket(self, bucket: str) -> list[Skill]:
        return [s for s in self.skills.values() if s.bucket == bucket]

    def search(self, bucket: str, query: np.ndarray, k: int) -> list[tuple[Skill, float]]:
        index = self.indexes.get(bucket)
        if index is None or not len(index):
            return []
        labels = self.by_label[bucket]
        return [(self.skills[labels[label]], cos) for label, cos in index.search(query, k)]

    def audit_items(self) -> list[dict[str, Any]]:
        """Every skill with its lifecycle state, for `grandrounds audit items`."""
        return [{"kind": "skill", "id": k.skill_id, "status": k.status, "branch": k.branch,
                 "category": k.category, "tool": k.tool, "utility": round(k.utility, 6), "version": k.version,
                 "usage": k.usage, "successes": k.successes, "failures": k.failures,
                 "last_adopted_window": k.last_adopted_window, "merged_into": k.merged_into,
                 "text": k.body.core_action, "name": k.body.name, "trigger": list(k.body.trigger),
                 "derived_from": list(k.derived_from), "created_seq": k.created_seq}
                for k in sorted(self.skills.values(), key=lambda k: k.skill_id)]

    def counts(self) -> dict[str, Any]:
        by_status = {s: 0 for s in ("draft", "active", "mature", "deprecated", "archived")}
        by_branch = {b: 0 for b in PREFIX}
        for s in self.skills.values():
            by_status[s.status] += 1
            if s.live:
                by_branch[s.branch] += 1
        return {"skills": by_status, "live_skills_by_branch": by_branch, "skill_windows_closed": self.window}

    # --- the fold ------------------------------------------------------------------------

    def apply(self, seq: int, payload: EventPayload, embed: Embed) -> None:
        handler = _FOLD.get(type(payload))
        if handler is not None:
            handler(self, seq, payload, embed)

    def _index(self, skill: Skill) -> None:
        index = self.indexes.get(skill.bucket)
        if index is None:
            index = self.indexes[skill.bucket] = VectorIndex(self.dim, exact_limit=self.exact_limit)
            self.by_label[skill.bucket] = {}
        label = index.add(skill.vec)
        self.label_of[skill.skill_id] = label
        self.by_label[skill.bucket][label] = skill.skill_id

    def _unindex(self, skill: Skill) -> None:
        label = self.label_of.pop(skill.skill_id, None)
        if label is not None:
            self.indexes[skill.bucket].remove(label)
            del self.by_label[skill.bucket][label]

    def _set_status(self, skill: Skill, status: str) -> None:
        was_live = skill.live
        skill.status = status
        if was_live and not skill.live:
            self._unindex(skill)
        elif skill.live and not was_live:
            self._index(skill)

    def _recorded(self, seq, p: sk.TrajectoryRecorded, embed) -> None:
        self.buffer.append(p)
        self.recorded_cases.add(p.case_id)

    def _assessed(self, seq, p: sk.TrajectoryAssessed, embed) -> None:
        self.assessments[p.case_id] = p

    def _drafted(self, seq, p: sk.SkillDrafted, embed) -> None:
        self.skills[p.skill_id] = Skill(p.skill_id, p.branch, p.category, p.tool, p.body, seq, utility=p.utility,
                                        derived_from=[p.source_case_id], vec=embed(skill_key_text(p.body)))
        self.counters[p.branch] += 1

    def _reviewed(self, seq, p: sk.SkillReviewed, embed) -> None:
        if p.kind == "create":
            self._set_status(self.skills[p.skill_id], "active" if p.accepted else "archived")

    def _patched(self, seq, p: sk.SkillPatched, embed) -> None:
        s = self.skills[p.skill_id]
        live = s.live
        if live:
            self._unindex(s)
        s.body, s.version = p.body, p.version
        s.vec = embed(skill_key_text(p.body))
        if p.source_case_id not in s.derived_from:
            s.derived_from.append(p.source_case_id)
        if live:
            self._index(s)

    def _utility(self, seq, p: sk.SkillUtilityUpdated, embed) -> None:
        s = self.skills[p.skill_id]
        s.utility = p.new
        s.usage += p.adopted_pos + p.adopted_neg
        s.successes += p.adopted_pos
        s.failures += p.adopted_neg
        if p.adopted_pos + p.adopted_neg:
            s.last_adopted_window = p.window

    def _window_closed(self, seq, p: sk.WindowClosed, embed) -> None:
        self.window = p.window + 1
        self.buffer = []
        self.assessments = {}
        self.baselines = {c: Baseline(ema, n) for c, (ema, n) in sorted(p.baselines.items())}

    def _matured(self, seq, p: sk.SkillMatured, embed) -> None:
        self._set_status(self.skills[p.skill_id], "mature")

    def _deprecated(self, seq, p: sk.SkillDeprecated, embed) -> None:
        self._set_status(self.skills[p.skill_id], "deprecated")

    def _merged(self, seq, p: sk.SkillMerged, embed) -> None:
        kept, gone = self.skills[p.kept], self.skills[p.absorbed]
        for cid in gone.derived_from:
            if cid not in kept.derived_from:
                kept.derived_from.append(cid)
        kept.usage += gone.usage
        kept.successes += gone.successes
        kept.failures += gone.failures
        if gone.last_adopted_window is not None:
            kept.last_adopted_window = max(kept.last_adopted_window or 0, gone.last_adopted_window)
        gone.merged_into = kept.skill_id
        self._set_status(gone, "archived")

    def _archived(self, seq, p: sk.SkillArchived, embed) -> None:
        self._set_status(self.skills[p.skill_id], "archived")

    def _governed(self, seq, p: sk.GovernancePassed, embed) -> None:
        self.governed_window = p.window


_FOLD = {
    sk.TrajectoryRecorded: SkillMemory._recorded,
    sk.TrajectoryAssessed: SkillMemory._assessed,
    sk.SkillDrafted: SkillMemory._drafted,
    sk.SkillReviewed: SkillMemory._reviewed,
    sk.SkillPatched: SkillMemory._patched,
    sk.SkillUtilityUpdated: SkillMemory._utility,
    sk.WindowClosed: SkillMemory._window_closed,
    sk.SkillMatured: SkillMemory._matured,
    sk.SkillDeprecated: SkillMemory._deprecated,
    sk.SkillMerged: SkillMemory._merged,
    sk.SkillArchived: SkillMemory._archived,
    sk.GovernancePassed: SkillMemory._governed,
}


def _same(a: SkillMemory, b: SkillMemory) -> bool:
    """Fold equality (rebuild vs live): everything but index internals and vectors."""
    return (a.skills == b.skills and a.window == b.window and a.buffer == b.buffer
            and a.recorded_cases == b.recorded_cases and a.assessments == b.assessments
            and a.baselines == b.baselines and a.governed_window == b.governed_window
            and a.counters == b.counters
            and {k: sorted(v.values()) for k, v in a.by_label.items()}
            == {k: sorted(v.values()) for k, v in b.by_label.items()})


SkillMemory.__eq__ = lambda self, other: isinstance(other, SkillMemory) and _same(self, other)  # type: ignore
SkillMemory.__hash__ = None  # type: ignore


register_part("skemex", SkillMemory)
