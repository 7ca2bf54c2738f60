"""Value-aware skill retrieval (SkeMex §3.3).

Candidates: live skills (active, mature) of the general branch, the case's category
(task-level) and the tools the case can use (action-level), whose required tools are all
available and whose cosine to the case is at least 0.2. Score
0.4·sim + 0.4·U + 0.2·S, S = exp(−Δwindows/τ), τ = min(4·(1 + sqrt(successes)), 20),
S = 0 for a never-adopted skill, mature skills ×1.1. Top 6: up to 2 per branch first,
then the best remaining.
"""

from __future__ import annotations

from typing import Iterable
from grandrounds.store.case_content import own_set
import math  # sqrt only (correctly rounded by IEEE 754); exp goes through exact_math
from dataclasses import dataclass

import numpy as np

from grandrounds.handlers.policies.skemex.config import SkeMexPolicy
from grandrounds.store import exact_math
from grandrounds.handlers.policies.skemex.memory import Skill, SkillMemory

BRANCHES = ("general", "task", "action")


def strength(skill: Skill, window: int, cfg: SkeMexPolicy) -> float:
    """Memory strength: an Ebbinghaus-style decay over learning windows since the skill was
    last adopted, slower for skills with more successes; 0 if it was never adopted."""
    if skill.last_adopted_window is None:
        return 0.0
    tau = min(cfg.strength_tau_base * (1.0 + math.sqrt(skill.successes)), cfg.strength_tau_cap)
    return exact_math.exp(-max(0, window - skill.last_adopted_window) / tau)


def skill_score(sim: float, skill: Skill, window: int, cfg: SkeMexPolicy) -> tuple[float, float]:
    """(score, strength)."""
    s = strength(skill, window, cfg)
    score = cfg.w_similarity * sim + cfg.w_utility * skill.utility + cfg.w_strength * s
    if skill.status == "mature" and cfg.maturation:
        score *= cfg.mature_bonus
    return score, s


@dataclass(frozen=True)
class Scored:
    skill: Skill
    similarity: float
    strength: float
    score: float


def buckets_for(category: str, tools: list[str]) -> list[str]:
    return ["general", f"task:{category}", *[f"action:{t}" for t in sorted(tools)]]


def candidates(mem: SkillMemory, cfg: SkeMexPolicy, own: str | Iterable[str], category: str, tools: list[str],
               query: np.ndarray) -> list[Scored]:
    available, own = set(tools), own_set(own)
    out: list[Scored] = []
    for bucket in buckets_for(category, tools):
        for skill, sim in mem.search(bucket, query, cfg.candidate_pool):
            if sim < cfg.min_similarity:
                break  # best first: the rest are below the threshold too
            if not own.isdisjoint(skill.derived_from):  # leakage guard: the case or a case of the same content
                continue
            if not set(skill.body.required_tools) <= available:
                continue
            score, s = skill_score(sim, skill, mem.window, cfg)
            out.append(Scored(skill, sim, s, score))
    return out


def select(scored: list[Scored], cfg: SkeMexPolicy) -> list[Scored]:
    """Top K with a per-branch quota first, then the best remaining; best first, ties by age."""
    ranked = sorted(scored, key=lambda c: (-c.score, c.skill.created_seq, c.skill.skill_id))
    rank = {c.skill.skill_id: i for i, c in enumerate(ranked)}
    chosen: list[Scored] = []
    for branch in BRANCHES:
        chosen += [c for c in ranked if c.skill.branch == branch][: cfg.per_branch]
    chosen = sorted(chosen, key=lambda c: rank[c.skill.skill_id])[: cfg.top_k]
    taken = {c.skill.skill_id for c in chosen}
    chosen += [c for c in ranked if c.skill.skill_id not in taken][: cfg.top_k - len(chosen)]
    return sorted(chosen, key=lambda c: rank[c.skill.skill_id])
