"""Events of the SkeMex skill lifecycle (seed 001; DESIGN §6).

Every status transition of a skill (draft → active → mature, → deprecated, → archived),
every patch, merge and utility change is one event, so `audit history <skill-id>` can tell
a skill's whole life. Decisions are made by handlers/policies/skemex and arrive here made;
handlers/policies/skemex/memory.py folds them. All of them change memory a later run could start from
(the learning window and the category baselines included), so all carry memory.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.store.events import EventPayload, event

Branch = Literal["general", "task", "action"]
"""general: any case; task: one task category; action: one tool's use."""
Adoption = Literal["adopted+", "adopted-", "ignored"]
Decision = Literal["CREATE", "PATCH", "NONE"]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _SkillEvent(EventPayload):
    carries_memory: ClassVar[bool] = True


class SkillBody(_Part):
    """The content of a skill, in the structure of the paper's released skills."""

    name: str
    description: str
    """When the skill applies, in one sentence."""
    applicable_conditions: str
    core_action: str
    """What to do (the `### Core Action` section)."""
    trigger: list[str] = Field(default_factory=list)
    """Key terms of the situations it was distilled from (the sim matches them)."""
    required_tools: list[str] = Field(default_factory=list)
    risk_level: Literal["low", "medium", "high"] = "medium"


@event("skill.trajectory_recorded")
class TrajectoryRecorded(_SkillEvent):
    """One finished case enters the learning window; `retained` says whether the buffer keeps it
    for distillation (every recorded trajectory still feeds the utility update)."""

    case_id: str
    category: str
    reward: float
    turns: int
    injected: list[str]
    adoption: dict[str, Adoption]
    """Heuristic labels from the trajectory (answer source / skill ids it names) and the reward."""
    retained: bool
    drop_reason: str | None = None
    """simple-success | loop | max-steps | infra-error."""
    question: str
    options: dict[str, str]
    gold: str
    answer: str
    answer_source: str
    trace: list[str]
    tools: list[str]
    """Tools the case could use."""


@event("skill.trajectory_assessed")
class TrajectoryAssessed(_SkillEvent):
    """Distillation pass 1 on a retained trajectory: adoption labels and the write decision."""

    case_id: str
    labels: dict[str, Adoption]
    decision: Decision
    target_skill_id: str | None = None
    rationale: str = ""


@event("skill.drafted")
class SkillDrafted(_SkillEvent):
    """Distillation pass 2 (CREATE): a new skill as a draft, before review."""

    skill_id: str
    branch: Branch
    category: str | None = None
    tool: str | None = None
    body: SkillBody
    utility: float
    source_case_id: str


@event("skill.reviewed")
class SkillReviewed(_SkillEvent):
    """The review gate on a draft (→ active, or → archived) or on a patch (applied or not)."""

    skill_id: str
    kind: Literal["create", "patch"]
    accepted: bool
    reason: str
    source_case_id: str


@event("skill.patched")
class SkillPatched(_SkillEvent):
    skill_id: str
    body: SkillBody
    version: int
    source_case_id: str
    reason: str = ""


@event("skill.utility_updated")
class SkillUtilityUpdated(_SkillEvent):
    """The once-per-window, category-normalised, adoption-aware update of one skill."""

    skill_id: str
    window: int
    old: float
    new: float
    lr: float
    mean_delta: float
    adopted_pos: int
    adopted_neg: int
    advantages: list[float]
    """A = reward − category baseline of each trajectory that adopted the skill."""


@event("skill.window_closed")
class WindowClosed(_SkillEvent):
    window: int
    """Index of the window that closed (0-based); the next one is `window + 1`."""
    cases: list[str]
    distilled: list[str]
    """Retained trajectories that were distilled (at most the buffer capacity)."""
    over_capacity: list[str] = Field(default_factory=list)
    """Retained trajectories the buffer had no room for."""
    failed: list[str] = Field(default_factory=list)
    """Retained trajectories whose distillation call failed (nothing written from them)."""
    baselines: dict[str, tuple[float, int]]
    """Category → (EMA baseline, samples) after this window's rewards."""


@event("skill.matured")
class SkillMatured(_SkillEvent):
    skill_id: str
    utility: float
    usage: int
    window: int


@event("skill.deprecated")
class SkillDeprecated(_SkillEvent):
    skill_id: str
    utility: float
    window: int
    reason: str


@event("skill.merged")
class SkillMerged(_SkillEvent):
    """`absorbed` is archived into `kept`, which inherits its provenance and usage."""

    kept: str
    absorbed: str
    cosine: float
    window: int


@event("skill.archived")
class SkillArchived(_SkillEvent):
    """Evicted by branch capacity (or a rejected draft, recorded by `skill.reviewed`)."""

    skill_id: str
    reason: str
    window: int


@event("skill.governed")
class GovernancePassed(_SkillEvent):
    """A governance pass ran after `window` (so it runs once per due window, also on resume)."""

    window: int
    merged: int
    deprecated: int
    matured: int
    archived: int
