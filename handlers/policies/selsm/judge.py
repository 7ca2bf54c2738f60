"""SELSM's LLM-as-judge (seed 000 §2.2.1–2.2.2): trajectory states, step labels, logical skills.

A trajectory is rebuilt from the recorded `AgentStep`s as decisions: each decision t has
the state it was taken in, s_{t-1} = agent_state(question, transitions so far) — exactly the
string the agent loops pass to per-step retrieval, so stored states and query states live in
the same space — plus its reasoning, action and observation. One judge call per trajectory
labels every decision (+/−) and writes one logical skill for it; the paper's J(s_t, a_t) is
per round, and a single call over the whole trajectory sees each round's accumulated state
as the prefix before it (our reading: same inputs, one exchange instead of T).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.handlers.cases import Case, FhirCase
from grandrounds.handlers.policies.base import ModelTask, agent_state
from grandrounds.handlers.policies.fhir_lessons import calls_of, fhir_terms, procedure, task_label, verdict_line
from grandrounds.handlers.text import key_terms
from grandrounds.store.event_types import AgentStep, AnswerGiven
from grandrounds.handlers.policies.selsm.events import JudgedStep, LogicalSkill


@dataclass(frozen=True)
class Decision:
    """One decision of a trajectory, as the judge and the record see it."""

    round: int
    state: str
    """s_{t-1}: the state the decision was taken in (`agent_state`)."""
    reasoning: str
    action: str
    """`call <tool>`, `invalid action`, or `answer <letter>`."""
    observation: str
    memory: str = ""
    """Ids of the skills injected before the decision (empty when none)."""


def _tool_name(content: str) -> str:
    if content.startswith("{"):
        try:
            return str(json.loads(content).get("name", content))
        except json.JSONDecodeError:
            return content
    return content


def decisions_of(question: str, steps: list[AgentStep]) -> list[Decision]:
    """The decisions of a recorded trajectory, with the states both agent loops build.

    Tool turns become `(call <tool>, observation)` transitions; an observation without a tool
    call is an invalid turn (`invalid action`); the response ends the trajectory. The openai
    loop's "final step: answer taken from untagged output" note belongs to the response.
    """
    transitions: list[tuple[str, str]] = []
    out: list[Decision] = []
    reasoning: list[str] = []
    memory = ""
    pending_tool: str | None = None
    for step in steps:
        if step.kind == "memory":
            memory = step.content
        elif step.kind == "reasoning":
            reasoning.append(step.content)
        elif step.kind == "tool":
            pending_tool = _tool_name(step.content)
        elif step.kind == "observation":
            if step.content.startswith("final step:"):
                reasoning.append(step.content)
                continue
            action = f"call {pending_tool}" if pending_tool is not None else "invalid action"
            out.append(Decision(len(out) + 1, agent_state(question, transitions), " ".join(reasoning), action,
                                step.content, memory))
            transitions.append((action, step.content))
            reasoning, memory, pending_tool = [], "", None
        elif step.kind == "response":
            out.append(Decision(len(out) + 1, agent_state(question, transitions), " ".join(reasoning),
                                f"answer {step.content}", "", memory))
    return out


# --- the model's answer ------------------------------------------------------------------------


class StepVerdict(BaseModel):
    """The judge's verdict on one decision (lenient at the boundary; checked before storing)."""

    model_config = ConfigDict(extra="ignore")

    round: int = Field(description="The decision's round number t, as given in the trajectory.")
    label: Literal["+", "-"] = Field(description="'+' if the step was correct and useful, '-' if it was wrong.")
    category: str = Field(description="Parameter Mapping, Data Extraction, Age Calculation Logic, API Protocol, "
                                      "Temporal Reasoning, Safety Check, or Clinical Reasoning.")
    task_scenario: str = Field(description="When this skill applies, in generic terms.")
    generalized_logic: str = Field(description="The operational rule: why the step was right (+), or the "
                                               "error signature mapped to the correct rule (-).")
    canonical_example: str = Field(description="The rule applied to a generic instance (no identifiers).")
    error_avoidance: str = Field(description="What to avoid.")
    trigger: list[str] = Field(default_factory=list, description="3-8 generic key terms the skill applies to.")


class JudgeVerdict(BaseModel):
    model_config = ConfigDict(extra="ignore")

    steps: list[StepVerdict] = Field(description="One verdict per decision round, in order.")


JUDGE_SYSTEM = """You are the step-level judge of a clinical agent's memory (SELSM).
You see a case, the agent's trajectory as numbered decision rounds (the state before each round is
everything above it), and the graded outcome. For EVERY round, decide:
  label '+' if the action was correct and moved towards the right answer, '-' if it was wrong or wasteful;
  and write ONE logical skill in the template
    Task Scenario -> Generalized Logic -> Canonical Example -> Error Avoidance.
For '+' write a Success Paradigm: why the action was right (correct mapping logic, appropriate filter
conditions, valid calculation). For '-' write a Correction Axiom: map the error signature to the correct
rule, stressing constraint conflicts and priority rules.
Abstraction protocol (skills are checked by code and rejected otherwise): skills must be entity-agnostic —
no patient names, no identifiers or record numbers, no URLs or endpoints, no dates, no numbers copied from
this case. Describe findings and rules generically so they transfer to other patients. When the lesson is
which option answers a presentation, name that option's text in the Canonical Example."""


FHIR_NOTE = ("This is a MedAgentBench FHIR task: the agent acts in an EHR through FHIR functions (GET reads, POST "
             "writes) and ends with FINISH([...]); the official grader checks the calls and the FINISH list. Skills "
             "describe the FHIR calls by resource type, search parameter and payload field names (e.g. 'GET "
             "Patient?identifier=…'), never with a host, an identifier, a name, a date or a value.")


def judge_prompt(case: Case, decisions: list[Decision], answer: AnswerGiven, correct: bool,
                 reasoning_shown: bool, gold: str = "") -> str:
    rounds = []
    for d in decisions:
        lines = [f"### Round {d.round}"]
        if d.memory:
            lines.append(f"skills injected: {d.memory}")
        if reasoning_shown and d.reasoning:
            lines.append(f"reasoning: {d.reasoning}")
        lines.append(f"action: {d.action}")
        if d.observation:
            lines.append(f"observation: {d.observation}")
        rounds.append("\n".join(lines))
    verdict = "correct" if correct else "wrong"
    if case.kind == "fhir":
        return (f"## FHIR task (type {case.task_type}, category: {case.category})\n{FHIR_NOTE}\n\n"
                f"{case.instruction}\n\n## Context\n{case.context}\n\n## Trajectory\n" + "\n\n".join(rounds) +
                f"\n\n## Outcome\nThe agent finished with {answer.answer}: graded {verdict} by {gold or case.answer}.")
    options = "\n".join(f"{k}) {v}" for k, v in case.options.items())
    return (f"## Case (category: {case.category})\n{case.question}\n\nOptions:\n{options}\n\n"
            f"## Trajectory\n" + "\n\n".join(rounds) +
            f"\n\n## Outcome\nThe agent answered {answer.answer} ({verdict}); the correct answer is "
            f"{case.answer}) {case.options[case.answer]}.")


def offline_verdict(case: Case, decisions: list[Decision], answer: AnswerGiven, correct: bool) -> JudgeVerdict:
    """The sim backbone's judge: deterministic, from the prompt's inputs (gold visible: after feedback).

    The answer round gets a success paradigm (correct) or a correction axiom (wrong) whose
    Canonical Example names the gold option's text, triggered by the case's key terms; tool
    rounds are labelled by whether the tool's output was the gold option and name no option.
    """
    if case.kind == "fhir":
        return offline_fhir_verdict(case, decisions, answer, correct)
    gold_text = case.options[case.answer]
    terms = key_terms(case.question)
    shown = ", ".join(terms[:6])
    out: list[StepVerdict] = []
    for d in decisions:
        if d.action.startswith("answer "):
            right = correct
            out.append(StepVerdict(
                round=d.round, label="+" if right else "-", category="Parameter Mapping",
                task_scenario=f"A {case.category} case presenting with {shown} asks for a single best option.",
                generalized_logic=("Map the defining findings together to the option that explains all of them, "
                                   "and commit to it at the first decision." if right else
                                   "An option chosen for shared wording conflicted with the defining findings; "
                                   "the defining findings take priority over surface overlap."),
                canonical_example=f"Presentation with {shown} -> answer '{gold_text}'.",
                error_avoidance=("Do not switch to an option that merely shares words with the vignette." if right
                                 else "Do not answer by word overlap when the defining findings point elsewhere."),
                trigger=terms))
        elif d.action.startswith("call "):
            tool = d.action.removeprefix("call ")
            helpful = d.observation.endswith(f"-> {case.answer}")
            out.append(StepVerdict(
                round=d.round, label="+" if helpful else "-", category="API Protocol",
                task_scenario=f"A {case.category} case where the {tool} tool can be consulted.",
                generalized_logic=(f"The {tool} output agreed with the correct option: use it as supporting evidence."
                                   if helpful else f"The {tool} output was empty or named a wrong option: "
                                   "corroborate it with the findings before adopting it."),
                canonical_example=f"Consult {tool} on a presentation with {', '.join(terms[:4])}, then weigh its output.",
                error_avoidance=f"Do not adopt the {tool} output without checking it against the findings.",
                trigger=terms))
        else:
            out.append(protocol_breach(d.round, terms, "one tool call or one response"))
    return JudgeVerdict(steps=out)


def protocol_breach(round_: int, terms: list[str], actions: str) -> StepVerdict:
    """The sim judge's verdict on a turn that broke the action protocol; `actions`: what one turn may
    hold after its reasoning, in the protocol's words (MCQ: a tool call or a response; FHIR: a call or FINISH)."""
    return StepVerdict(
        round=round_, label="-", category="API Protocol",
        task_scenario="An agent turn that broke the action protocol.",
        generalized_logic=f"Each turn needs reasoning followed by exactly {actions}.",
        canonical_example="Reason briefly, then give exactly one tagged action.",
        error_avoidance="Do not emit untagged or multiple actions in one turn.",
        trigger=terms)


def offline_fhir_verdict(case: FhirCase, decisions: list[Decision], answer: AnswerGiven,
                         correct: bool) -> JudgeVerdict:
    """The sim judge on a FHIR trajectory: every round is labelled by the graded outcome (the grader
    judges the whole trajectory: the calls and the FINISH list), and its skill names the task
    template's key terms and the call (or the whole action pattern, for the FINISH round) by resource
    type and parameter names only, so it passes the entity checker."""
    terms = fhir_terms(case.instruction)
    label = task_label(terms)
    pattern = procedure(answer.steps, answer.answer)
    calls = iter(calls_of(answer.steps))
    mark = "+" if correct else "-"
    out: list[StepVerdict] = []
    for d in decisions:
        if d.action.startswith("call "):
            call = next(calls, d.action)
            out.append(StepVerdict(
                round=d.round, label=mark, category="API Protocol",
                task_scenario=f"{label}: the agent calls a FHIR function.",
                generalized_logic=(f"The call {call} was part of the pattern the grader accepted: make it with "
                                   "the instruction's own values in those parameters or fields." if correct else
                                   f"The call {call} was part of a pattern the grader refused: check the "
                                   "resource and the parameters or fields the task needs before calling."),
                canonical_example=f"For {label}: {call}.",
                error_avoidance="Do not put values of another patient or task into the call; do not call "
                                "functions the task does not need.",
                trigger=terms))
        elif d.action.startswith("answer "):
            out.append(StepVerdict(
                round=d.round, label=mark, category="Data Extraction",
                task_scenario=f"{label}: the agent finishes the task.",
                generalized_logic=(f"Complete the pattern, then finish: {pattern}." if correct else
                                   f"The pattern {pattern} was refused; {verdict_line(False)}."),
                canonical_example=f"For {label}: {pattern}.",
                error_avoidance="Do not finish before the calls the task needs are made, and put only what the "
                                "task asks back into the FINISH list.",
                trigger=terms))
        else:
            out.append(protocol_breach(d.round, terms, "one function call or one FINISH"))
    return JudgeVerdict(steps=out)


def judge_task(case: Case, decisions: list[Decision], answer: AnswerGiven, correct: bool,
               reasoning_shown: bool, gold: str = "") -> ModelTask[JudgeVerdict]:
    """`gold`: for a FHIR task, the grader's verdict (`refsol:taskN: reason`) shown in the outcome."""
    return ModelTask(
        purpose="selsm-step-judge", system=JUDGE_SYSTEM,
        prompt=judge_prompt(case, decisions, answer, correct, reasoning_shown, gold), response=JudgeVerdict,
        offline=lambda: offline_verdict(case, decisions, answer, correct))


def judged_steps(verdict: JudgeVerdict, decisions: list[Decision], case: Case,
                 operational_logic: bool) -> list[JudgedStep]:
    """The verdicts mapped onto the trajectory's decisions: one per round that exists (the
    first verdict for a round wins), as logical skills. Without operational logic a skill keeps
    only its scenario and example (the paper's "w/o Operational Logic")."""
    by_round: dict[int, StepVerdict] = {}
    for v in verdict.steps:
        by_round.setdefault(v.round, v)
    out: list[JudgedStep] = []
    for d in decisions:
        v = by_round.get(d.round)
        if v is None:
            continue
        skill = LogicalSkill(
            label=v.label, category=v.category.strip() or "General", scenario=v.task_scenario.strip(),
            logic=v.generalized_logic.strip() if operational_logic else "",
            example=v.canonical_example.strip(),
            avoidance=v.error_avoidance.strip() if operational_logic else "",
            trigger=[t.strip().lower() for t in v.trigger if t.strip()] or
            (fhir_terms(case.question) if case.kind == "fhir" else key_terms(case.question)))
        out.append(JudgedStep(round=d.round, action=d.action, skill=skill))
    return out
