"""The `openai` backbone: a ReAct agent and a structured reflector over `LLMGateway`.

Works with any OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, LM Studio). Served from a
recorded run, the same class is the `record` backend: only the gateway's transport differs.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from grandrounds.handlers.agent.protocol import stated_answer
from grandrounds.handlers.agent.react import AgentConfig, run_mcq_agent
from grandrounds.handlers.agent.step_memory import SUMMARISER
from grandrounds.handlers.backbones.base import CaseFailure
from grandrounds.handlers.cases import Case, CaseView, FhirCase, FhirCaseView
from grandrounds.handlers.llm.errors import LLMUnavailable, StructuredOutputError
from grandrounds.handlers.llm.gateway import LLMGateway
from grandrounds.handlers.llm.recorder import Recorder
from grandrounds.handlers.llm.structured import Mode, structured
from grandrounds.handlers.tools import ToolBox
from grandrounds.store.event_types import AnswerGiven, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded, RuleEditProposal


class EditDraft(BaseModel):
    """A rule edit as the model proposes it (lenient at the boundary; checked by `reflect`)."""

    model_config = ConfigDict(extra="ignore")

    op: Literal["add", "edit", "reprioritise", "retire"]
    rule_id: str | None = None
    text: str | None = None
    trigger: list[str] | None = None
    priority: Literal[0, 1, 2] | None = None
    reason: str = ""


class ReflectionDraft(BaseModel):
    model_config = ConfigDict(extra="ignore")

    summary: str = Field(description="One or two sentences: what was asked, what was answered, what was right.")
    guideline: str = Field(description="A reusable, case-independent guideline for similar presentations.")
    edits: list[EditDraft] = Field(default_factory=list, description="Patch-style edits to the procedural rules.")


REFLECT_SYSTEM = """You maintain the procedural memory of a clinical reasoning agent.
After each case you see the case, the agent's answer and trajectory, the correct answer, and the rules
that were shown to the agent. Write a short summary, one reusable guideline, and patch-style rule edits:
  add (text, trigger key terms, priority 0 = most urgent .. 2), edit (rule_id, new text),
  reprioritise (rule_id, priority), retire (rule_id). Propose no edit when memory is already right.
Rules must be general clinical knowledge, never mention this case's identifiers."""


def review_parts(memory: MemoryRetrieved, answer: AnswerGiven, fb: FeedbackRecorded,
                 step_chars: int | None = None) -> tuple[str, str, str]:
    """What a reflection prompt shows of a case: the rules shown to the agent, its trajectory (each
    step cut at `step_chars`; None: whole) and the verdict."""
    rules = "\n".join(f"- {r.rule_id} [P{r.priority}] {r.text}" for r in memory.rules) or "(none)"
    trace = "\n".join(f"{s.kind}: {s.content[:step_chars]}" for s in answer.steps)
    return rules, trace, "correct" if fb.correct else "wrong"


def reflection_prompt(case: Case, memory: MemoryRetrieved, answer: AnswerGiven, fb: FeedbackRecorded) -> str:
    options = "\n".join(f"{k}) {v}" for k, v in case.options.items())
    rules, trace, verdict = review_parts(memory, answer, fb)
    return (f"## Case (category: {case.category})\n{case.question}\n\nOptions:\n{options}\n\n"
            f"## Rules shown to the agent\n{rules}\n\n## Agent trajectory\n{trace}\n\n"
            f"## Outcome\nAgent answered {stated_answer(answer.answer, case.options)}; correct answer: {case.answer}) "
            f"{case.options[case.answer]} ({verdict}).")


FHIR_REFLECT_SYSTEM = """You maintain the procedural memory of an agent that works in an EHR through FHIR functions
(MedAgentBench tasks: GET to read, POST to write, FINISH([...]) to answer).
After each task you see the instruction, the agent's FHIR calls and answer, the official grader's verdict and the
action pattern the grader checks, and the rules that were shown to the agent. Write a short summary, one reusable
guideline for tasks of this kind, and patch-style rule edits:
  add (text, trigger key terms, priority 0 = most urgent .. 2), edit (rule_id, new text),
  reprioritise (rule_id, priority), retire (rule_id). Propose no edit when memory is already right.
Rules must describe the task template and the correct FHIR calls and payload fields, never this task's patient,
MRN, names, dates or values."""


def fhir_reflection_prompt(case: FhirCase, memory: MemoryRetrieved, answer: AnswerGiven,
                           fb: FeedbackRecorded) -> str:
    from grandrounds.handlers.environments.medagentbench import REFERENCE_PATTERNS

    rules, trace, verdict = review_parts(memory, answer, fb, step_chars=1500)
    return (f"## FHIR task (type {case.task_type}, category: {case.category})\n{case.instruction}\n\n"
            f"## Context\n{case.context}\n\n## Rules shown to the agent\n{rules}\n\n"
            f"## Agent trajectory\n{trace}\n\n"
            f"## Outcome\nAgent finished with {answer.answer}; graded {verdict} by {fb.gold}.\n"
            f"What the grader checks for this task type: {REFERENCE_PATTERNS[case.task_type]}.")


class OpenAIBackbone:
    name = "openai"
    records_exchanges = True
    summarises = True
    """Its agent loops write RetroSum's retrospective summaries (`act(..., retrospection=)`)."""

    def __init__(self, gateway: LLMGateway, note: str, agent: AgentConfig = AgentConfig(),
                 structured_mode: Mode = "auto"):
        self.gateway = gateway
        self.model = gateway.model
        self.note = note
        self.agent = agent
        self.structured_mode = structured_mode

    async def act(self, view: CaseView, memory: MemoryRetrieved, toolbox: ToolBox, rng: np.random.Generator,
                  recorder: Recorder | None = None, step_memory=None, retrospection=None) -> AnswerGiven:
        """`retrospection`: the policy's retrospective summaries (RetroSum), else the agent's `summary_every`."""
        if recorder is None:
            raise ValueError("the openai backbone records every exchange: the stage must pass a recorder")
        try:
            return await run_mcq_agent(self.gateway, view, memory, toolbox, recorder, self.agent, step_memory,
                                       retrospection)
        except LLMUnavailable as exc:
            raise CaseFailure(f"model unavailable: {exc}") from None

    async def act_fhir(self, view: FhirCaseView, memory: MemoryRetrieved, tools,
                       recorder: Recorder | None = None, step_memory=None, retrospection=None) -> AnswerGiven:
        """A FHIR task through the environment's tools (`FhirTools`), with the run's memory before the
        task. The environment names the protocol: `official` (MedAgentBench's own text protocol and
        prompt, memory in the same user message, per-step guidance appended to the message each round is
        sent with) or `react` (the SkeMex-style loop); both show per-step guidance when the policy has it.
        RetroSum's retrospective summaries (`retrospection`) run in the `react` loop only: the official
        protocol is MedAgentBench's conversation, which grading reads, and has no place for them."""
        from grandrounds.handlers.agent.fhir_react import fhir_memory_block, run_fhir_agent

        if recorder is None:
            raise ValueError("the openai backbone records every exchange: the stage must pass a recorder")
        if getattr(tools, "protocol", "react") == "official":
            return await act_fhir_official(self.gateway, view, tools, recorder, fhir_memory_block(memory.prefix),
                                           step_memory)
        lessons = [i.text for i in memory.items if i.detail.get("audience") == SUMMARISER]  # RetroSum experience
        return await run_fhir_agent(self.gateway, view, tools, recorder, self.agent,
                                    memory_prefix=fhir_memory_block(memory.prefix), step_memory=step_memory,
                                    retrospection=retrospection, lessons=lessons)

    async def act_osce(self, view, memory: MemoryRetrieved, tools, recorder: Recorder | None = None,
                       patient_recorder: Recorder | None = None, step_memory=None) -> AnswerGiven:
        """An AgentClinic OSCE case (`OsceTools`): the model doctor (each turn recorded, stage `act`), the
        run's memory as its memory block, against the model-played patient (stage `patient`)."""
        from grandrounds.handlers.agent.osce_act import run_osce_act

        if recorder is None or patient_recorder is None:
            raise ValueError("the openai backbone records every exchange: the stage must pass recorders")
        return await run_osce_act(view, memory, tools, self.gateway, recorder, patient_recorder, self.agent.actions)

    async def reflect(self, case: Case, memory: MemoryRetrieved, answer: AnswerGiven, feedback: FeedbackRecorded,
                      recorder: Recorder | None = None) -> ReflectionRecorded:
        if recorder is None:
            raise ValueError("the openai backbone records every exchange: the stage must pass a recorder")
        if getattr(case, "kind", None) == "osce":
            from grandrounds.handlers.environments.osce_env import OSCE_REFLECT_SYSTEM, osce_reflection_prompt

            messages = [{"role": "system", "content": OSCE_REFLECT_SYSTEM},
                        {"role": "user", "content": osce_reflection_prompt(case, memory, answer, feedback)}]
        elif isinstance(case, FhirCase):
            messages = [{"role": "system", "content": FHIR_REFLECT_SYSTEM},
                        {"role": "user", "content": fhir_reflection_prompt(case, memory, answer, feedback)}]
        else:
            messages = [{"role": "system", "content": REFLECT_SYSTEM},
                        {"role": "user", "content": reflection_prompt(case, memory, answer, feedback)}]
        try:
            draft = await structured(self.gateway, messages, ReflectionDraft, recorder, "reflection",
                                     self.structured_mode)
        except (LLMUnavailable, StructuredOutputError) as exc:
            raise CaseFailure(f"reflection failed: {exc}") from None
        edits = [RuleEditProposal(**e.model_dump()) for e in draft.edits]
        return ReflectionRecorded(summary=draft.summary, guideline=draft.guideline, edits=edits)

    async def solve(self, task, recorder: Recorder | None = None):
        """A policy's model task (handlers/policies/base.py `ModelTask`) as a structured call."""
        if recorder is None:
            raise ValueError("the openai backbone records every exchange: the stage must pass a recorder")
        messages = [{"role": "system", "content": task.system}, {"role": "user", "content": task.prompt}]
        try:
            return await structured(self.gateway, messages, task.response, recorder, task.purpose,
                                    self.structured_mode)
        except (LLMUnavailable, StructuredOutputError) as exc:
            raise CaseFailure(f"{task.purpose} failed: {exc}") from None

    async def aclose(self) -> None:
        await self.gateway.aclose()


async def act_fhir_official(gateway, view: FhirCaseView, tools, recorder: Recorder, memory_block: str,
                            step_memory=None) -> AnswerGiven:
    """One MedAgentBench episode in the official protocol. FINISH is the answer (source `llm:official`,
    whose steps hold the conversation grading reads); an invalid action, the round limit or an
    unreachable model end the episode without a result, a `CaseFailure` typed accordingly."""
    from grandrounds.handlers.agent.fhir_official import run_official_fhir_agent
    from grandrounds.handlers.environments.medagentbench.environment import OFFICIAL_SOURCE

    run = await run_official_fhir_agent(gateway, view, tools, recorder, tools.functions_json, tools.max_rounds,
                                        memory_prefix=memory_block, step_memory=step_memory)
    if run.status == "completed":
        return AnswerGiven(answer=run.result, source=OFFICIAL_SOURCE, steps=run.steps)
    reason = {"invalid_action": f"invalid action at round {run.rounds}: the reply starts with none of GET, POST, "
                                "FINISH(",
              "limit_reached": f"no FINISH within {tools.max_rounds} rounds",
              "error": run.error or "error"}[run.status]
    termination = {"invalid_action": "invalid_action", "limit_reached": "turn_limit"}.get(run.status, "error")
    raise CaseFailure(reason, run.steps, termination)
