"""Two-pass trajectory-to-skill distillation and the review gate (SkeMex §3.4, App. L.2).

Pass 1 reads a retained trajectory with the skills that were injected into it and returns
an adoption label per skill (adopted+ / adopted− / ignored) and one write decision:
CREATE a new skill, PATCH an injected one, or NONE. Pass 2 writes the skill (a draft for
CREATE, a revised body for PATCH) in the structure of the paper's released skills (name,
description, applicable conditions, required tools, risk level, core action). A draft then
passes review: quality (well-formed, compact, branch-consistent), novelty (no live skill of
its bucket within cosine 0.8) and capacity (its bucket is not full of mature skills).

Both passes run after feedback, so the gold answer is legitimately in the prompt. The
`offline` answers (sim backbone) follow the same inputs deterministically: labels from the
answer's source and the reward; a failure that followed a closely matching skill patches
it, any other failure (or an informative success with no skill behind it) creates a skill
naming the correct option with the case's key terms as trigger.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.handlers.policies.precedents import rule_text
from grandrounds.handlers.policies.base import ModelTask
from grandrounds.handlers.policies.fhir_lessons import fhir_terms, procedure, task_label, verdict_line
from grandrounds.handlers.policies.skemex.config import SkeMexPolicy
from grandrounds.handlers.text import content_tokens, key_terms, trigger_overlap
from grandrounds.store.event_types import AgentStep
from grandrounds.handlers.policies.skemex.events import Adoption, Branch, Decision, SkillBody, TrajectoryRecorded
from grandrounds.handlers.policies.skemex.memory import Skill

PATCH_OVERLAP = 0.6
"""Offline pass 1: a failing trajectory patches the skill it followed when the skill's trigger
covers this much of the case (the sim's reading of "the skill matched but said the wrong thing")."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AdoptionJudgement(_Model):
    skill_id: str
    label: Adoption
    evidence: str = Field(description="The step or answer that shows the skill was (not) followed.")


class Assessment(_Model):
    """Pass 1."""

    labels: list[AdoptionJudgement]
    decision: Decision
    target_skill_id: str | None = Field(None, description="For PATCH: the injected skill to revise.")
    branch: Branch | None = Field(None, description="For CREATE: general, task or action.")
    tool: str | None = Field(None, description="For an action-level skill: the tool it governs.")
    rationale: str


class Draft(_Model):
    """Pass 2: one skill in the released skills' structure."""

    name: str = Field(description="snake_case, 3-8 words")
    description: str = Field(description="One sentence: 'When ...' — the situation the skill is for.")
    applicable_conditions: str
    core_action: str = Field(description="Imperative, concrete, reusable; what to do and what not to do.")
    trigger: list[str] = Field(description="3-12 lowercase key terms of situations where it applies.")
    required_tools: list[str] = Field(default_factory=list)
    risk_level: Literal["low", "medium", "high"] = "medium"


SYSTEM_ASSESS = """You are the trajectory encoder of a self-evolving skill memory for a medical agent.
You read one finished clinical task: the case, the skills that were injected into the agent's context, the
agent's trajectory (reasoning, tool calls, observations, final answer) and the evaluation result with the
reference answer. Your job is twofold.
1. Adoption: for EVERY injected skill, decide whether the agent adopted it. "adopted+" = the agent
   followed the skill and it helped (or was consistent with) the correct outcome; "adopted-" = the agent
   followed the skill and it misled or hurt the outcome; "ignored" = the skill did not influence the
   trajectory. Judge by the trajectory (cited skill ids, actions that carry out the skill's core action),
   not by topical similarity. Quote the evidence.
2. Write decision, exactly one of:
   - CREATE: the trajectory contains a reusable lesson no injected skill covers (a recurring reasoning
     pattern, a pitfall that caused the error, a tool-use rule). Choose the branch: "general" (any
     clinical task), "task" (specific to this task category), "action" (how to use one tool).
   - PATCH: an injected skill applied here but is incomplete or wrong; name it in target_skill_id.
   - NONE: nothing reusable beyond what the repository already says, or the case is idiosyncratic.
Prefer NONE over writing a skill that only restates this one case."""

SYSTEM_DRAFT = """You write one skill for a medical agent's skill repository, from a trajectory and the
encoder's decision. A skill is a compact, reusable unit of procedural knowledge, not a case summary:
- description: one sentence starting "When ..." naming the situation;
- applicable_conditions: the observable conditions under which it applies (and when it does not);
- core_action: imperative steps the agent should take, including what NOT to do; concrete enough to act
  on, general enough to transfer to new patients (no patient identifiers, ages, dates or record numbers);
  when the lesson is a clinical decision, name the decisive findings and the correct choice;
- trigger: 3-12 lowercase key terms that recognise the situation;
- required_tools: only tools the action really needs (empty for pure reasoning);
- risk_level: high when ignoring the skill can harm a patient.
For a PATCH, rewrite the given skill so it also covers this trajectory, keeping what was right."""


FHIR_NOTE = ("This is a MedAgentBench FHIR task: the agent acts in an EHR through FHIR functions (GET reads, POST "
             "writes) and answers with FINISH([...]); the reference is the official grader's verdict. A skill for "
             "it names the FHIR calls (resource types, search parameters, payload fields) and the FINISH list the "
             "task template needs, never this task's patient, identifiers, dates or values.")


def is_fhir(t: TrajectoryRecorded) -> bool:
    """A FHIR task's trajectory: no options, graded by the official refsol rules."""
    return not t.options and t.gold.startswith("refsol:")


def _fhir_case_block(t: TrajectoryRecorded) -> str:
    trace = "\n".join(f"  {line}" for line in t.trace) or "  (no steps)"
    return (f"## Task (category: {t.category}; FHIR functions: {', '.join(t.tools) or 'none'})\n{FHIR_NOTE}\n\n"
            f"{t.question}\n\n## Trajectory ({t.turns} turns)\n{trace}\nFinal answer: {t.answer} "
            f"(decided by {t.answer_source})\n\n## Evaluation\nreward {t.reward:g}; official grader: {t.gold}")


def _case_block(t: TrajectoryRecorded) -> str:
    if is_fhir(t):
        return _fhir_case_block(t)
    options = "\n".join(f"{k}) {v}" for k, v in sorted(t.options.items()))
    trace = "\n".join(f"  {line}" for line in t.trace) or "  (no steps)"
    return (f"## Task (category: {t.category}; tools available: {', '.join(t.tools) or 'none'})\n{t.question}\n"
            f"{options}\n\n## Trajectory ({t.turns} turns)\n{trace}\nFinal answer: {t.answer} "
            f"(decided by {t.answer_source})\n\n## Evaluation\nreward {t.reward:g}; reference answer {t.gold}) "
            f"{t.options.get(t.gold, '')}")


def render_skill(s: Skill) -> str:
    b = s.body
    tools = ", ".join(b.required_tools) or "none"
    return (f"[{s.skill_id}] {b.name} (branch {s.branch}; status {s.status}; utility {s.utility:.2f}; "
            f"required tools: {tools})\n  When: {b.description}\n  Applies if: {b.applicable_conditions}\n"
            f"  Core action: {b.core_action}")


def assess_task(t: TrajectoryRecorded, injected: list[Skill]) -> ModelTask[Assessment]:
    skills = "\n".join(render_skill(s) for s in injected) or "(none)"
    prompt = (f"{_case_block(t)}\n\n## Injected skills\n{skills}\n\n"
              "Return the adoption label of every injected skill and one decision (CREATE / PATCH / NONE).")
    return ModelTask("skill-assess", SYSTEM_ASSESS, prompt, Assessment, lambda: offline_assessment(t, injected))


def draft_task(t: TrajectoryRecorded, a: Assessment, target: Skill | None) -> ModelTask[Draft]:
    what = (f"PATCH this skill:\n{render_skill(target)}" if target is not None else
            f"CREATE a {a.branch or 'task'}-level skill" + (f" for tool {a.tool}" if a.tool else ""))
    prompt = f"{_case_block(t)}\n\n## Encoder decision\n{a.decision}: {a.rationale}\n\n{what}"
    return ModelTask("skill-draft", SYSTEM_DRAFT, prompt, Draft, lambda: offline_draft(t, a, target))


# --- offline (sim) answers -------------------------------------------------------------------


def offline_assessment(t: TrajectoryRecorded, injected: list[Skill]) -> Assessment:
    labels = [AdoptionJudgement(skill_id=s.skill_id, label=t.adoption.get(s.skill_id, "ignored"),
                                evidence=f"answer decided by {t.answer_source}, reward {t.reward:g}")
              for s in injected]
    followed = next((s for s in injected if t.answer_source == f"skill:{s.skill_id}"), None)
    tool = t.answer_source.removeprefix("tool:") if t.answer_source.startswith("tool:") else None
    if t.reward >= 1.0:
        if followed is not None:
            return Assessment(labels=labels, decision="NONE", rationale="an existing skill already led to success")
        return Assessment(labels=labels, decision="CREATE", branch="task",
                          rationale="informative success not covered by any skill")
    if followed is not None and trigger_overlap(followed.body.trigger, content_tokens(t.question)) >= PATCH_OVERLAP:
        return Assessment(labels=labels, decision="PATCH", target_skill_id=followed.skill_id,
                          rationale="the followed skill matched this presentation but named the wrong choice")
    if tool is not None:
        return Assessment(labels=labels, decision="CREATE", branch="action", tool=tool,
                          rationale=f"the answer followed a wrong output of {tool}")
    return Assessment(labels=labels, decision="CREATE", branch="task", rationale="corrective skill after a wrong answer")


def trace_steps(t: TrajectoryRecorded) -> list[AgentStep]:
    """The recorded trace lines (`kind: content`) back as steps."""
    out = []
    for line in t.trace:
        kind, _, content = line.partition(": ")
        out.append(AgentStep(kind=kind, content=content))
    return out


def _function_name(step: AgentStep) -> str | None:
    if step.kind != "tool":
        return None
    try:
        call = json.loads(step.content)
    except json.JSONDecodeError:
        return None
    return call.get("name") if isinstance(call, dict) else None


def offline_fhir_draft(t: TrajectoryRecorded, a: Assessment, target: Skill | None) -> Draft:
    """A FHIR trajectory's skill: the template's key terms and the action pattern (resource types,
    parameter and field names, FINISH shape), kept as the procedure on success and as the pattern not
    to repeat unchanged on failure. Entity-agnostic by construction (fhir_lessons)."""
    steps = trace_steps(t)
    terms = fhir_terms(t.question)
    pattern = procedure(steps, t.answer)
    used = sorted({name for name in map(_function_name, steps) if name in t.tools})
    label = task_label(terms)
    core = (f"For {label}: {pattern}; {verdict_line(True)}." if t.reward >= 1.0 else
            f"For {label}: the agent did {pattern}, and {verdict_line(False)}.")
    return Draft(name="_".join([*terms[:3], "fhir", "procedure"]),
                 description=f"When an EHR task asks: {' '.join(terms) or 'a FHIR task of this template'}.",
                 applicable_conditions=f"The instruction follows the template of {label}; the EHR is reachable "
                                       "through the FHIR functions.",
                 core_action=core, trigger=terms or key_terms(t.question), required_tools=used, risk_level="medium")


def offline_draft(t: TrajectoryRecorded, a: Assessment, target: Skill | None) -> Draft:
    if is_fhir(t):
        return offline_fhir_draft(t, a, target)
    terms = key_terms(t.question)
    gold_text = t.options[t.gold]
    tool = a.tool if a.branch == "action" else None
    core = rule_text(terms, gold_text)
    if tool is not None:
        core = f"Do not take {tool}'s output on trust here. {core}"
    return Draft(name="_".join([*terms[:3], "choice"]) or "case_choice",
                 description=f"When a {t.category} case presents with {', '.join(terms[:4])}.",
                 applicable_conditions=f"The presentation includes {', '.join(terms[:8])}.",
                 core_action=core, trigger=terms, required_tools=[tool] if tool else [], risk_level="medium")


def body_of(d: Draft) -> SkillBody:
    return SkillBody(name=d.name.strip(), description=d.description.strip(),
                     applicable_conditions=d.applicable_conditions.strip(), core_action=d.core_action.strip(),
                     trigger=[w.strip().lower() for w in d.trigger if w.strip()][:12],
                     required_tools=sorted({x.strip() for x in d.required_tools if x.strip()}),
                     risk_level=d.risk_level)


def quality_problem(body: SkillBody, branch: str, tool: str | None, cfg: SkeMexPolicy) -> str | None:
    """Why a draft fails the quality check, or None."""
    if not body.name or not body.description or not body.applicable_conditions:
        return "quality: missing name, description or applicable conditions"
    if len(body.core_action) < cfg.min_core_chars:
        return "quality: core action too short to act on"
    if len(body.core_action) > cfg.max_core_chars:
        return "quality: core action too long for a compact skill"
    if branch == "action" and (not tool or tool not in body.required_tools):
        return "quality: an action-level skill must require the tool it governs"
    return None
