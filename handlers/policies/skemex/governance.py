"""Repository governance (SkeMex §3.6), every `governance_every` learning windows.

In the paper's order: merge near-duplicates (cosine ≥ 0.8 within a bucket), deprecate
low-utility skills (U < 0.3), promote stable high-utility skills (U ≥ 0.75 and ≥ 15
adoptions) to mature, then enforce branch capacity (12 general, 8 per category, 5 per tool).
Capacity evicts in lifecycle order: deprecated skills first, then active ones, mature
skills last; within a status the lowest utility goes first, then the one adopted least
recently, then the oldest. These functions decide; the policy emits the events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grandrounds.handlers.policies.skemex.config import SkeMexPolicy
from grandrounds.handlers.policies.skemex.memory import Skill, SkillMemory
from grandrounds.store.vectors import cosine as exact_cosine

EVICTION_ORDER = {"deprecated": 0, "active": 1, "mature": 2}


def keep_rank(s: Skill) -> tuple:
    """Which of two duplicates survives a merge: mature over active, higher utility, more
    adoptions, then the older skill."""
    return (s.status != "mature", -s.utility, -s.usage, s.created_seq, s.skill_id)


def merges(mem: SkillMemory, cfg: SkeMexPolicy) -> list[tuple[Skill, Skill, float]]:
    """(kept, absorbed, cosine) pairs: each live skill absorbs the lower-ranked live skills of
    its bucket within the merge threshold (found through the bucket's index)."""
    out: list[tuple[Skill, Skill, float]] = []
    gone: set[str] = set()
    for bucket in sorted(mem.indexes):
        live = sorted((s for s in mem.in_bucket(bucket) if s.live), key=keep_rank)
        for kept in live:
            if kept.skill_id in gone:
                continue
            for other, cos in mem.search(bucket, kept.vec, cfg.candidate_pool):
                if cos < cfg.merge_cosine:
                    break
                if other.skill_id == kept.skill_id or other.skill_id in gone or keep_rank(other) < keep_rank(kept):
                    continue
                gone.add(other.skill_id)
                out.append((kept, other, float(cos)))
    return out


def to_deprecate(mem: SkillMemory, cfg: SkeMexPolicy, skip: set[str]) -> list[Skill]:
    return [s for s in _ordered(mem) if s.live and s.skill_id not in skip and s.utility < cfg.deprecate_below]


def to_mature(mem: SkillMemory, cfg: SkeMexPolicy, skip: set[str]) -> list[Skill]:
    return [s for s in _ordered(mem) if s.status == "active" and s.skill_id not in skip
            and s.utility >= cfg.mature_utility and s.usage >= cfg.mature_min_usage]


def capacity_of(bucket: str, cfg: SkeMexPolicy) -> int:
    if bucket == "general":
        return cfg.capacity_general
    return cfg.capacity_task if bucket.startswith("task:") else cfg.capacity_action


def eviction_key(s: Skill, status: str) -> tuple:
    last = -1 if s.last_adopted_window is None else s.last_adopted_window
    return (EVICTION_ORDER[status], s.utility, last, s.created_seq, s.skill_id)


def evictions(mem: SkillMemory, cfg: SkeMexPolicy, status_now: dict[str, str]) -> list[Skill]:
    """Skills to archive so that every bucket holds at most its capacity of unarchived skills.
    `status_now` has the statuses this pass already decided (merges, deprecations, maturations)."""
    out: list[Skill] = []
    buckets = sorted({s.bucket for s in mem.skills.values()})
    for bucket in buckets:
        held = [s for s in mem.in_bucket(bucket) if status_now.get(s.skill_id, s.status) in EVICTION_ORDER]
        excess = len(held) - capacity_of(bucket, cfg)
        if excess > 0:
            held.sort(key=lambda s: eviction_key(s, status_now.get(s.skill_id, s.status)))
            out += held[:excess]
    return out


def _ordered(mem: SkillMemory) -> list[Skill]:
    return sorted(mem.skills.values(), key=lambda s: (s.created_seq, s.skill_id))


@dataclass
class Plan:
    merged: list[tuple[Skill, Skill, float]]
    deprecated: list[Skill]
    matured: list[Skill]
    archived: list[Skill]


def plan(mem: SkillMemory, cfg: SkeMexPolicy) -> Plan:
    status: dict[str, str] = {}
    merged = merges(mem, cfg) if cfg.merging else []
    for _, gone, _ in merged:
        status[gone.skill_id] = "archived"
    deprecated = to_deprecate(mem, cfg, set(status)) if cfg.deprecation else []
    for s in deprecated:
        status[s.skill_id] = "deprecated"
    matured = to_mature(mem, cfg, set(status)) if cfg.maturation else []
    for s in matured:
        status[s.skill_id] = "mature"
    archived = evictions(mem, cfg, status) if cfg.capacity else []
    return Plan(merged, deprecated, matured, archived)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return exact_cosine(a, b)
