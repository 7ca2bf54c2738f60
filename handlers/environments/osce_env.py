"""The AgentClinic OSCE environment of a `grandrounds run --env agentclinic`: per case, the simulated
patient and the measurement tool (the environment's side: they know the case, the doctor does not);
after the answer, the grader (an LLM judge through the run's model, or the normalised string match).

Built from an `OsceEnvironmentRecord`: the case file (by content: the sim doctor's differential is
that file's diagnosis vocabulary, as in `grandrounds agentclinic`) and the turn budget. Nothing of it
is machine-specific, so `grandrounds verify` builds it again from the `run.started` meta once the
file checks out (same path, same sha256).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.handlers.environments.agentclinic_osce import (LLMPatient, MeasurementTool, OsceCase, RulePatient,
                                                    diagnosis_vocabulary, load_osce_cases)
from grandrounds.handlers.environments.base import META_KEY, FileRef
from grandrounds.store.canonical import content_hash
from grandrounds.store.event_types import AgentStep, AnswerGiven


class OsceEnvironmentRecord(BaseModel):
    """Which OSCE environment a run used: enough to build it again and to tell whether it is the same."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["agentclinic"] = "agentclinic"
    cases: FileRef
    """The AgentClinic case file: its whole diagnosis vocabulary is the sim doctor's differential."""
    max_turns: int = Field(ge=1)
    """Doctor turns per case (AgentClinic's default 20)."""
    judge_model: str | None = None
    """A separate moderator model (AgentClinic's `moderator_llm`, `--judge-model`) asked the official Yes/No
    question; None: the run's own model judges. Part of what the run is (its verdicts decide `correct`),
    so it is in the identity; where it is served from (`--judge-base-url`) is not."""

    def identity(self) -> dict[str, Any]:
        out = {"environment": self.name, "cases_file": self.cases.sha256, "max_turns": self.max_turns}
        if self.judge_model is not None:  # runs without one keep the source they always had
            out["judge_model"] = self.judge_model
        return out

    def source(self, cases: list[BaseModel]) -> str:
        """`RunSpec.source`: another case selection, file or turn budget is a different run."""
        return content_hash({"cases": content_hash([c.model_dump(mode="json") for c in cases]),
                             **self.identity()})

    def meta(self) -> dict[str, Any]:
        return {META_KEY: self.model_dump(mode="json", exclude_none=True)}

    def refs(self) -> tuple[FileRef, ...]:
        return (self.cases,)


@dataclass
class OsceTools:
    """One case's side of the dialogue: the patient and the measurement tool. Built from the whole
    case (as `ToolBox` is for MCQ cases); the doctor only talks to them."""

    case: OsceCase
    differential: list[str]
    """The sim doctor's label space: the case's NEJM answers, else the file's diagnosis vocabulary."""
    max_turns: int
    measurement: MeasurementTool = field(init=False)

    def __post_init__(self) -> None:
        self.measurement = MeasurementTool(self.case)

    @property
    def test_menu(self) -> tuple[str, ...]:
        return self.case.test_menu

    def patient(self, gateway=None, recorder=None):
        """The rule-based patient offline; the model-played one (recorded, stage `patient`) with a model."""
        return RulePatient(self.case) if gateway is None else LLMPatient(self.case, gateway, recorder)


class OsceEnvironment:
    name = "agentclinic"

    def __init__(self, record: OsceEnvironmentRecord, vocabulary: list[str]):
        self.record = record
        self.vocabulary = vocabulary
        self.max_turns = record.max_turns
        self.judge_transport = None
        """Builds the transport of a live judge model served elsewhere than the run's model (`--judge-base-url`;
        set by the composition root); None: the judge is reached through the run's own transport (its
        endpoint live; its recorded exchanges in a record run or `grandrounds verify`, served by request
        hash, the judge's model included)."""
        self._judge = None
        self._own_transport = None

    def judge_gateway(self, run_gateway):
        """The gateway the moderator is asked through: the run's own when no separate judge model is named,
        else one for `record.judge_model` (temperature 0, the run's retry policy), built once per run."""
        if self.record.judge_model is None or run_gateway is None:
            return run_gateway
        if self._judge is None:
            from grandrounds.handlers.llm.gateway import LLMGateway

            transport = run_gateway.transport
            if self.judge_transport is not None and not _serves_record(transport):
                transport = self._own_transport = self.judge_transport()
            self._judge = LLMGateway(transport, self.record.judge_model, params={"temperature": 0.0},
                                     retry=run_gateway.retry)
        return self._judge

    async def aclose(self) -> None:
        """Close the judge's own connections (the run's transport is the backbone's to close)."""
        if self._own_transport is not None:
            await self._own_transport.aclose()
            self._own_transport = None

    def tools_for(self, case: OsceCase) -> OsceTools:
        return OsceTools(case, list(case.options) or self.vocabulary, self.max_turns)

    def public(self, text: str) -> str:
        return text

    def recorded_steps(self, steps: list[AgentStep], tools: OsceTools) -> list[AgentStep]:
        return steps


def _serves_record(transport) -> bool:
    from grandrounds.handlers.llm.record import RecordedTransport

    return isinstance(transport, RecordedTransport)


@contextmanager
def open_environment(record: OsceEnvironmentRecord) -> Iterator[OsceEnvironment]:
    yield OsceEnvironment(record, diagnosis_vocabulary(load_osce_cases(record.cases.path)))


# -- the dialogue as the pipeline records it -----------------------------------------------------

_FAVOUR = re.compile(r"favour '([^']+)'")
SIM_FOLLOW_OVERLAP = 0.5
"""The sim doctor follows a rule when half its trigger terms were heard: OSCE dialogues share many
words (limb, difficulty, weakness), so the MCQ sim's 0.25 lets one presentation's rule decide another's."""


def dialogue_steps(turns) -> list[AgentStep]:
    """Each doctor turn verbatim (`tool`: a question for the patient or a REQUEST TEST), what came
    back (`observation`, `Patient: ...` / `Measurement: ...`), and the diagnosis turn (`response`).
    A schema turn (actions `schema`) is preceded by its `reasoning` step (so each turn's mode shows),
    and its move is recorded as rendered in AgentClinic's words; an off-schema one is its reasoning (or
    raw reply) and the corrective observation."""
    steps: list[AgentStep] = []
    for t in turns:
        if t.raw is not None:
            steps.append(AgentStep(kind="reasoning", content=t.reasoning or t.raw))
        if t.action.kind == "invalid":
            steps.append(AgentStep(kind="observation", content=t.reply or ""))
            continue
        if t.action.kind == "diagnosis":
            steps.append(AgentStep(kind="response", content=t.doctor))
            continue
        speaker = "Measurement" if t.action.kind == "test" else "Patient"
        steps.append(AgentStep(kind="tool", content=t.doctor))
        steps.append(AgentStep(kind="observation", content=f"{speaker}: {t.reply}"))
    return steps


def adopted_rule(memory, diagnosis: str) -> str | None:
    """`rule:<id>` of the first retrieved rule whose favoured diagnosis is the answer (adoption, as
    the MCQ sim's `source` shows it), else None."""
    for r in memory.rules:
        m = _FAVOUR.search(r.text)
        if m and m.group(1).strip().lower() == diagnosis.strip().lower():
            return f"rule:{r.rule_id}"
    return None


async def judge_answer(ctx, case: OsceCase, answer: AnswerGiven):
    """The grader's `Judgement`: the LLM judge (recorded, stage `judge`) when the backbone has a model — the
    separate `--judge-model` when the run names one, else the run's own — else (sim) the normalised string
    match."""
    from grandrounds.handlers.environments.osce_grading import judge
    from grandrounds.handlers.llm.recorder import records_exchanges, stage_recorder

    gateway = getattr(ctx.backbone, "gateway", None) if records_exchanges(ctx.backbone) else None
    if gateway is not None and ctx.environment is not None:
        gateway = ctx.environment.judge_gateway(gateway)  # a separate moderator model when the run names one
    recorder = stage_recorder(ctx.writer, case.case_id, "judge") if gateway is not None else None
    mode = getattr(ctx.backbone, "structured_mode", "auto")
    said = next((s.content for s in reversed(answer.steps) if s.kind == "response"), None)
    return await judge(answer.answer or None, case.correct_diagnosis, gateway, recorder, mode, doctor_turn=said)


# -- reflection (gold visible) -------------------------------------------------------------------

BOILERPLATE = frozenset({"assess", "diagnose", "diagnosis", "evaluate", "patient", "presenting", "presents",
                         "underlying", "condition", "based", "clinical", "presentation", "examination", "findings",
                         "need", "further", "diagnostic", "workup", "doctor", "results", "history", "significant",
                         "reports", "denies", "normal", "abnormal", "likely"})
"""Words every OSCE objective and dialogue shares: no use as a rule's trigger."""


def osce_terms(case: OsceCase, answer: AnswerGiven, limit: int = 8) -> list[str]:
    """The case's key findings, as the doctor heard them: distinctive words of the objective and the
    patient's answers (not test values), in order of appearance."""
    from grandrounds.handlers.text import key_terms

    heard = [s.content.removeprefix("Patient: ") for s in answer.steps
             if s.kind == "observation" and s.content.startswith("Patient: ")]
    return [t for t in key_terms(" ".join([case.objective, *heard]), limit=40) if t not in BOILERPLATE][:limit]


def dialogue_summary(answer: AnswerGiven) -> str:
    asked = sum(s.kind == "tool" and "REQUEST TEST" not in s.content.upper() for s in answer.steps)
    tests = [s.content for s in answer.steps if s.kind == "tool" and "REQUEST TEST" in s.content.upper()]
    return f"{asked} questions, {len(tests)} tests"


OSCE_REFLECT_SYSTEM = """You maintain the procedural memory of a doctor agent in OSCE diagnosis dialogues (AgentClinic):
it questions a simulated patient, requests tests ("REQUEST TEST: X") and ends with "DIAGNOSIS READY: X".
After each case you see the objective, the dialogue, the doctor's diagnosis, the correct diagnosis and the judge's
verdict, and the rules that were shown to the doctor. Write a short summary, one reusable guideline, and
patch-style rule edits:
  add (text, trigger key terms, priority 0 = most urgent .. 2), edit (rule_id, new text),
  reprioritise (rule_id, priority), retire (rule_id). Propose no edit when memory is already right.
A rule links a presentation (key symptoms, signs and test findings) to a diagnosis or to the questions and tests
that separate it from its mimics; write it as "If the presentation includes <findings>: favour '<diagnosis>'."
when it names a diagnosis. Never name this patient's age, name or other identifying details."""


def osce_reflection_prompt(case: OsceCase, memory, answer: AnswerGiven, fb) -> str:
    rules = "\n".join(f"- {r.rule_id} [P{r.priority}] {r.text}" for r in memory.rules) or "(none)"
    trace = "\n".join(f"{s.kind}: {s.content[:1500]}" for s in answer.steps)
    verdict = "correct" if fb.correct else "wrong"
    return (f"## OSCE case ({case.category})\nObjective: {case.objective}\n\n## Rules shown to the doctor\n{rules}\n\n"
            f"## Dialogue\n{trace}\n\n## Outcome\nThe doctor diagnosed: {answer.answer or '(nothing)'}; "
            f"correct diagnosis: {case.correct_diagnosis} ({verdict}).")
