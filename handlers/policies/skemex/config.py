"""SkeMex parameters (seed 001, DESIGN §6). Defaults are the paper's (Appendix F, Table 11);
fields the paper leaves open say where our value comes from."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from grandrounds.handlers.policies.config import PolicyBase


class SkeMexPolicy(PolicyBase):
    """SkeMex: general / task-level / action-level skills, value-aware retrieval, windowed
    learning buffer, two-pass distillation with review, adoption-aware utility, governance."""

    name: Literal["skemex"] = "skemex"
    writing: bool = True
    """Write memory at all (false freezes the repository: offline test mode, the w/o-writing ablation)."""

    # --- retrieval (§3.3) ---------------------------------------------------------------
    top_k: int = Field(6, ge=0)
    """K: skills injected per case."""
    per_branch: int = Field(2, ge=0)
    """Quota per branch filled first (general, task-level, action-level); the rest by score."""
    min_similarity: float = 0.2
    """Prescreening: candidates below this cosine to the case are dropped."""
    w_similarity: float = 0.4
    """λ_sim."""
    w_utility: float = 0.4
    """λ_u."""
    w_strength: float = 0.2
    """λ_h: weight of memory strength S = exp(−Δwindows/τ)."""
    strength_tau_base: float = 4.0
    """τ = min(base·(1 + sqrt(successes)), cap)."""
    strength_tau_cap: float = 20.0
    mature_bonus: float = 1.1
    """Score multiplier of mature skills."""
    candidate_pool: int = Field(64, ge=1)
    """Nearest skills per branch bucket scored exactly (left open by the paper: prescreening size)."""

    # --- learning buffer (§3.4) ---------------------------------------------------------
    window: int = Field(30, ge=1)
    """L: trajectories per learning window (distillation and utility update run when it fills)."""
    buffer_capacity: int = Field(20, ge=0)
    """Retained trajectories distilled per window (the most informative first)."""
    buffer_gating: bool = True
    """Drop uninformative trajectories before distillation (ablation: w/o buffer gating)."""
    simple_success_steps: int = Field(2, ge=0)
    """A success in at most this many agent turns is 'simple' and dropped."""
    loop_repeats: int = Field(3, ge=2)
    """The same action this many times in a row makes a trajectory a loop (dropped)."""
    max_steps: int = Field(7, ge=1)
    """Agent step budget: a failure that used it all is a max-step failure (dropped)."""

    # --- distillation and review ----------------------------------------------------------
    review: bool = True
    """Review gate on drafts: novelty, quality, capacity (ablation: w/o draft review)."""
    novelty_cosine: float = 0.8
    """A draft this close to a live skill of its bucket is not novel (same threshold as merging)."""
    min_core_chars: int = Field(20, ge=0)
    """Quality: the core action must say something (left open by the paper)."""
    max_core_chars: int = Field(1500, ge=1)
    """Quality: a skill is a compact unit, not a transcript (left open by the paper)."""
    initial_utility: float = 0.5
    """U of a new skill."""

    # --- utility (§3.5) ------------------------------------------------------------------
    valuation: bool = True
    """Update utilities from feedback (false: equal utilities, no updates: w/o valuation)."""
    lambda_pos: float = 1.0
    """λ+: adopted+ credit = λ+·A."""
    lambda_neg: float = 0.1
    """λ−: base penalty of an adopted− skill."""
    lambda_harm: float = 0.5
    """λ_harm: adopted− penalty = λ− + λ_harm·max(0, −A)."""
    baseline_alpha: float = 0.2
    """α of the per-category reward baseline EMA."""
    baseline_min_samples: int = Field(3, ge=0)
    """Samples before a category baseline is trusted; until then b = baseline_default."""
    baseline_default: float = 0.5
    lr_base: float = 0.05
    """η: adoption-count learning rate warms up lr_base → lr_max, then cosine-decays back."""
    lr_max: float = 0.20
    lr_warmup: int = Field(5, ge=0)
    """Adoptions over which η warms up."""
    lr_decay: int = Field(20, ge=1)
    """Adoptions over which η cosine-decays to lr_base after warmup."""

    # --- governance (§3.6) -----------------------------------------------------------------
    governance: bool = True
    """Run governance at all (false: no maturation, merging, deprecation or capacity control)."""
    governance_every: int = Field(2, ge=1)
    """Governance runs after every this many learning windows."""
    merging: bool = True
    merge_cosine: float = 0.8
    deprecation: bool = True
    deprecate_below: float = 0.3
    maturation: bool = True
    mature_utility: float = 0.75
    mature_min_usage: int = Field(15, ge=0)
    """Adoptions (adopted+ or adopted−) a skill needs before it can mature."""
    capacity: bool = True
    capacity_general: int = Field(12, ge=0)
    capacity_task: int = Field(8, ge=0)
    """Task-level skills per category."""
    capacity_action: int = Field(5, ge=0)
    """Action-level skills per tool."""

    ablations: ClassVar[dict[str, dict[str, Any]]] = {
        "no-writing": {"writing": False},
        "no-valuation": {"valuation": False},
        "no-governance": {"governance": False},
        "similarity-only": {"w_utility": 0.0, "w_strength": 0.0, "mature_bonus": 1.0},
        "no-maturation": {"maturation": False},
        "no-merge": {"merging": False},
        "no-deprecation": {"deprecation": False},
        "no-capacity": {"capacity": False},
        "no-buffer-gating": {"buffer_gating": False},
        "no-review": {"review": False},
    }
