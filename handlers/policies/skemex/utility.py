"""Utility-driven skill valuation (SkeMex §3.5), once per learning window.

Rewards are normalised per task category: A = reward − b, where b is an EMA (α = 0.2) of
the category's rewards, taken as 0.5 until it has 3 samples. Credit is adoption-aware:
a skill the agent adopted in a trajectory gets +λ+·A when the label is adopted+, and
−(λ− + λ_harm·max(0, −A)) when adopted−; ignored skills get nothing. Each skill moves
by the window mean of its credits: U ← clip(U + η·mean, 0, 1), with η a function of the
skill's adoption count before the update (warmup 0.05 → 0.20 over 5 adoptions, then
cosine decay to 0.05 over 20).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grandrounds.handlers.policies.skemex.config import SkeMexPolicy
from grandrounds.handlers.policies.skemex.events import Adoption, TrajectoryRecorded
from grandrounds.handlers.policies.skemex.memory import Baseline
from grandrounds.store import exact_math


def r6(x: float) -> float:
    return round(float(x), 6)


def learning_rate(adoptions: int, cfg: SkeMexPolicy) -> float:
    if cfg.lr_warmup and adoptions <= cfg.lr_warmup:
        return cfg.lr_base + (cfg.lr_max - cfg.lr_base) * adoptions / cfg.lr_warmup
    k = min(adoptions - cfg.lr_warmup, cfg.lr_decay)
    return cfg.lr_base + (cfg.lr_max - cfg.lr_base) * 0.5 * (1.0 + exact_math.cos_pi_fraction(k, cfg.lr_decay))


def baseline_value(b: Baseline | None, cfg: SkeMexPolicy) -> float:
    if b is None or b.n < cfg.baseline_min_samples:
        return cfg.baseline_default
    return b.ema


def observe(b: Baseline | None, reward: float, cfg: SkeMexPolicy) -> Baseline:
    """The EMA starts from the default (0.5) prior and moves with every reward of the category."""
    ema = cfg.baseline_default if b is None else b.ema
    n = 0 if b is None else b.n
    return Baseline(ema=r6((1.0 - cfg.baseline_alpha) * ema + cfg.baseline_alpha * reward), n=n + 1)


def credit(label: Adoption, advantage: float, cfg: SkeMexPolicy) -> float | None:
    if label == "adopted+":
        return cfg.lambda_pos * advantage
    if label == "adopted-":
        return -(cfg.lambda_neg + cfg.lambda_harm * max(0.0, -advantage))
    return None


@dataclass
class SkillCredit:
    deltas: list[float] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    pos: int = 0
    neg: int = 0


def window_credits(trajectories: list[TrajectoryRecorded], labels: dict[str, dict[str, Adoption]],
                   baselines: dict[str, Baseline], cfg: SkeMexPolicy
                   ) -> tuple[dict[str, SkillCredit], dict[str, Baseline]]:
    """Credits per skill over one window, in arrival order: each trajectory's advantage uses
    its category's baseline before its own reward is folded in. `labels[case_id]` are the
    adoption labels (pass 1's when the trajectory was assessed, the heuristic ones otherwise).
    Returns the credits and the baselines after the window."""
    base = dict(baselines)
    credits: dict[str, SkillCredit] = {}
    for t in trajectories:
        advantage = t.reward - baseline_value(base.get(t.category), cfg)
        for skill_id, label in sorted(labels.get(t.case_id, t.adoption).items()):
            delta = credit(label, advantage, cfg)
            if delta is None:
                continue
            c = credits.setdefault(skill_id, SkillCredit())
            c.deltas.append(delta)
            c.advantages.append(r6(advantage))
            c.pos += label == "adopted+"
            c.neg += label == "adopted-"
        base[t.category] = observe(base.get(t.category), t.reward, cfg)
    return credits, base


def updated_utility(utility: float, adoptions_before: int, c: SkillCredit, cfg: SkeMexPolicy
                    ) -> tuple[float, float, float]:
    """(new U, η, mean credit)."""
    mean = sum(c.deltas) / len(c.deltas)
    lr = learning_rate(adoptions_before, cfg)
    return r6(min(1.0, max(0.0, utility + lr * mean))), r6(lr), r6(mean)
