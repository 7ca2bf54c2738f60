"""Events of SELSM's logical-skill memory (seed 000; DESIGN §6).

Three kinds: what the step-level judge said about a trajectory (`selsm.trajectory.judged`,
audit only), a distilled skill the entity checker refused (`selsm.skill.rejected`, audit
only: a rejected skill never reaches memory), and a memory record R = (query, transitions)
(`selsm.record.stored`, the only one that changes memory). Embeddings are not in payloads:
the fold derives them from the texts through the embedding cache.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.store.events import EventPayload, event

StepLabel = Literal["+", "-"]
"""The judge's binary step label ℓ_t: `+` correct step, `-` wrong step."""

SKILL_KIND = {"+": "success paradigm", "-": "correction axiom"}
"""Dual skill generation: a `+` step yields a success paradigm e⁺, a `-` step a correction axiom e⁻."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogicalSkill(_Part):
    """A distilled, entity-agnostic logical skill in the paper's four-part template."""

    label: StepLabel
    """`+`: success paradigm (why the step was right); `-`: correction axiom (error signature → rule)."""
    category: str
    """Parameter Mapping, Data Extraction, Age Calculation Logic, API Protocol, Temporal Reasoning,
    Safety Check, ... (the paper's list; free text from the judge)."""
    scenario: str
    """Task Scenario: when the skill applies."""
    logic: str = ""
    """Generalized Logic: the operational rule (empty under the no-operational-logic ablation)."""
    example: str
    """Canonical Example: the rule applied to a generic instance."""
    avoidance: str = ""
    """Error Avoidance: what not to do (empty under the no-operational-logic ablation)."""
    trigger: list[str] = Field(default_factory=list)
    """Key terms the skill applies to (the sim backbone matches them against the case)."""


def render_skill(skill: LogicalSkill) -> str:
    """The text injected before a decision: Task Scenario → Generalized Logic → Canonical Example → Error Avoidance."""
    parts = [f"[{SKILL_KIND[skill.label]} · {skill.category}] Task Scenario: {skill.scenario}"]
    if skill.logic:
        parts.append(f"Generalized Logic: {skill.logic}")
    parts.append(f"Canonical Example: {skill.example}")
    if skill.avoidance:
        parts.append(f"Error Avoidance: {skill.avoidance}")
    return " | ".join(parts)


class JudgedStep(_Part):
    """The judge's verdict J(s_t, a_t) -> (ℓ_t, e_t) on one decision of a trajectory."""

    round: int
    """t, from 1: the decision's position in the trajectory."""
    action: str
    """a_t as recorded (`call <tool>`, `invalid action`, `answer <letter>`)."""
    skill: LogicalSkill


class StepLabelled(_Part):
    """A step's label as the judge gave it (its skill is in the record, or in a rejection)."""

    round: int
    action: str
    label: StepLabel


@event("selsm.trajectory.judged")
class TrajectoryJudged(EventPayload):
    """What the step-level judge returned for one sampled trajectory of a case (before the checker)."""

    sample: int
    """0 is the trajectory the case was graded on; 1..K-1 are the training-phase samples."""
    answer: str
    correct: bool
    reasoning_shown: bool
    """Whether the judge saw the agent's reasoning (false under the no-reasoning-trace ablation)."""
    steps: list[StepLabelled]
    """Every judged step; each one's skill is then either stored (`selsm.record.stored`) or
    rejected (`selsm.skill.rejected`), so the skill texts are not repeated here."""


class EntityViolation(_Part):
    category: Literal["identifier", "name", "url", "date", "instance-number", "email", "phone"]
    match: str
    """The offending text span."""


@event("selsm.skill.rejected")
class SkillRejected(EventPayload):
    """A distilled skill that failed the entity-agnostic check; it is never stored."""

    sample: int
    round: int
    label: StepLabel
    violations: list[EntityViolation]
    text: str
    """The rendered skill as the judge wrote it."""


class StoredTransition(_Part):
    """One transition-level tuple (s_t, a_t, ℓ_t, e_t) of a record."""

    skill_id: str
    sample: int
    round: int
    state: str
    """s_{t-1} as `agent_state` renders it: the state the decision was taken in (what retrieval matches)."""
    action: str
    skill: LogicalSkill


@event("selsm.record.stored")
class RecordStored(EventPayload):
    """A memory record R_i = (q_i, T_i): the case's query and the accepted transitions of all its
    samples. T_i is a set: a tuple (state, action, skill) that several samples produced is kept
    once, from the earliest sample."""

    carries_memory: ClassVar[bool] = True
    record_id: str
    source_case_id: str
    """The case the record was distilled from (leakage guard)."""
    query: str
    transitions: list[StoredTransition]
