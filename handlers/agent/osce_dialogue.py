"""The AgentClinic diagnosis dialogue: a doctor questions a simulated patient, orders tests from the
measurement tool, and ends with `DIAGNOSIS READY: <diagnosis>` — within a bounded number of turns.

Protocol (AgentClinic's doctor prompt): every doctor turn is one short utterance; one containing
`DIAGNOSIS READY: X` ends the dialogue with diagnosis X; one containing `REQUEST TEST: X` is answered
by the measurement tool; anything else is a question the patient answers. On the last turn the doctor
is told to diagnose now (AgentClinic's "This is the final question"); a doctor that never says
DIAGNOSIS READY has no diagnosis and is graded incorrect.

Two doctors: `LLMDoctor` (every turn one recorded gateway call) and `SimDoctor`, a deterministic
stand-in that runs the same path offline. The sim doctor's numbers are not clinical accuracy.
With `actions="schema"` (a server that enforces json_schema) each model doctor turn is decoded against
a schema of its legal moves (`handlers/agent/actions.py`: reasoning, then a question, a test or the
diagnosis; on the last turn only the diagnosis) and rendered into the text above before anyone else
sees it; an off-schema reply spends the turn and gets a corrective observation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Protocol

from grandrounds.handlers.agent.actions import (DOCTOR_SCHEMA_NAME, DoctorMove, osce_action_schema, parse_osce_turn,
                                                render_doctor_move, response_format)
from grandrounds.handlers.environments.agentclinic_osce import MeasurementTool, OsceView
from grandrounds.handlers.llm.errors import LLMUnavailable
from grandrounds.handlers.text import content_tokens, trigger_overlap

DIAGNOSIS_READY = re.compile(r"DIAGNOSIS READY\s*:\s*(.*)", re.IGNORECASE)
REQUEST_TEST = re.compile(r"REQUEST TEST\s*:\s*(.*)", re.IGNORECASE)
_STRIP = " \t[]\"'`*.<>"


@dataclass(frozen=True)
class DoctorAction:
    kind: Literal["question", "test", "diagnosis", "invalid"]
    text: str
    """The question, the test name, or the diagnosis; `invalid` (schema turns only): the corrective observation."""


def parse_doctor(utterance: str) -> DoctorAction:
    """AgentClinic's order: DIAGNOSIS READY wins over REQUEST TEST, which wins over a question.
    The diagnosis / test is the rest of its line, without brackets, quotes or a final period."""
    m = DIAGNOSIS_READY.search(utterance)
    if m:
        return DoctorAction("diagnosis", m.group(1).splitlines()[0].strip(_STRIP) if m.group(1) else "")
    m = REQUEST_TEST.search(utterance)
    if m:
        return DoctorAction("test", m.group(1).splitlines()[0].strip(_STRIP) if m.group(1) else "")
    return DoctorAction("question", utterance.strip())


@dataclass(frozen=True)
class DialogueTurn:
    turn: int
    doctor: str
    """What the doctor said, verbatim."""
    action: DoctorAction
    reply: str | None = None
    """The patient's answer, the measurement result or the corrective observation; None for the diagnosis turn."""
    raw: str | None = None
    """Schema turns: the model's JSON reply verbatim (`doctor` is its rendering in AgentClinic's words)."""
    reasoning: str | None = None
    """Schema turns: the reasoning the model gave before its move."""


@dataclass(frozen=True)
class SchemaSpeech:
    """A schema-decoded doctor turn: the reply as the model wrote it and the move read from it."""

    raw: str
    move: DoctorMove


def action_of(move: DoctorMove) -> tuple[str, DoctorAction]:
    """The move as AgentClinic's text and the action that text means: a test or diagnosis is cleaned as
    `parse_doctor` cleans it (first line, no brackets or quotes), so both protocols hand the measurement
    tool and the judge the same kind of string."""
    if move.kind == "invalid":
        return move.text, DoctorAction("invalid", move.text)
    text = move.text if move.kind == "question" else move.text.splitlines()[0].strip(_STRIP)
    return render_doctor_move(DoctorMove(move.kind, move.reasoning, text)), DoctorAction(move.kind, text)


@dataclass
class DialogueResult:
    status: Literal["diagnosed", "no_diagnosis", "failed"]
    diagnosis: str | None
    turns: list[DialogueTurn] = field(default_factory=list)
    error: str | None = None

    @property
    def tests_requested(self) -> list[str]:
        return [t.action.text for t in self.turns if t.action.kind == "test"]

    @property
    def questions(self) -> int:
        return sum(t.action.kind == "question" for t in self.turns)


class Doctor(Protocol):
    async def speak(self, view: OsceView, turns: list[DialogueTurn], turn: int,
                    max_turns: int) -> str | SchemaSpeech: ...


class Patient(Protocol):
    async def answer(self, question: str, transcript: list[tuple[str, str]]) -> str: ...


FINAL_NOTICE = "This is the final question. Please provide a diagnosis now, as DIAGNOSIS READY: [diagnosis]."


async def run_osce_dialogue(view: OsceView, doctor: Doctor, patient: Patient, measurement: MeasurementTool,
                            max_turns: int = 20) -> DialogueResult:
    turns: list[DialogueTurn] = []
    transcript: list[tuple[str, str]] = []  # (doctor question, patient answer), ("", test result): the patient's memory
    for turn in range(1, max_turns + 1):
        try:
            said = await doctor.speak(view, turns, turn, max_turns)
        except LLMUnavailable as exc:
            return DialogueResult("failed", None, turns, f"doctor model unavailable at turn {turn}: {exc}")
        raw = reasoning = None
        if isinstance(said, SchemaSpeech):
            raw, reasoning = said.raw, said.move.reasoning
            said, action = action_of(said.move)
        else:
            action = parse_doctor(said)
        if action.kind == "diagnosis":
            turns.append(DialogueTurn(turn, said, action, raw=raw, reasoning=reasoning))
            return DialogueResult("diagnosed", action.text or None, turns)
        if action.kind == "invalid":  # off-schema: the turn is spent, nothing reaches the patient
            turns.append(DialogueTurn(turn, raw or said, action, action.text, raw=raw, reasoning=reasoning))
            continue
        if action.kind == "test":
            reply = measurement.request(action.text)
            # agentclinic.py: the measurement is added to the patient's history (patient_agent.add_hist)
            transcript.append(("", reply))
        else:
            try:
                reply = await patient.answer(action.text, transcript)
            except LLMUnavailable as exc:
                return DialogueResult("failed", None, turns, f"patient model unavailable at turn {turn}: {exc}")
            transcript.append((action.text, reply))
        turns.append(DialogueTurn(turn, said, action, reply, raw=raw, reasoning=reasoning))
    return DialogueResult("no_diagnosis", None, turns, f"no DIAGNOSIS READY within {max_turns} turns")


# -- the model doctor ----------------------------------------------------------------------------

DOCTOR_SYSTEM = (
    "You are a doctor named Dr. Agent who only responds in the form of dialogue. You are inspecting a patient "
    "who you will ask questions in order to understand their disease. You are only allowed to ask {max_turns} "
    "questions total before you must make a decision. You have asked {asked} questions so far. You can request "
    "test results using the format "
    "\"REQUEST TEST: [test]\". For example, \"REQUEST TEST: Chest_X-Ray\". Your dialogue will only be 1-3 "
    "sentences in length. Once you have decided to make a diagnosis please type "
    "\"DIAGNOSIS READY: [diagnosis here]\".\n\nBelow is all of the information you have. {objective}. \n\n"
    "Remember, you must discover their disease by asking them questions. You are also able to provide exams.")
"""AgentClinic's doctor prompt (no bias variants, no images), with its question counter: the doctor's
turns so far (AgentClinic's `infs`)."""


SCHEMA_MOVES = (
    "\n\nEvery turn is one JSON object: \"reasoning\" (a few sentences on what you know so far), then "
    "\"action\", exactly one move: a question to the patient, e.g. {\"question\": \"How long have you had the "
    "cough?\"}; a test request, e.g. {\"test\": \"Chest_X-Ray\"}; or, once you have decided, your diagnosis, "
    "e.g. {\"diagnosis\": \"Community-acquired pneumonia\"}.")
"""Schema turns: the moves of the prompt above as the JSON the turn is decoded against."""

SCHEMA_FINAL_NOTICE = "This is the final question. Please provide a diagnosis now: your action is the diagnosis."


def doctor_messages(view: OsceView, turns: list[DialogueTurn], turn: int, max_turns: int,
                    memory_prefix: str = "", schema: bool = False) -> list[dict[str, str]]:
    system = DOCTOR_SYSTEM.format(max_turns=max_turns, asked=turn - 1, objective=view.objective)
    if schema:
        system += SCHEMA_MOVES
    if memory_prefix:
        system += f"\n\n## Memory from earlier cases\n{memory_prefix}"
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "The patient has come in. Begin the consultation."}]
    for t in turns:
        speaker = "Measurement" if t.action.kind == "test" else "Patient"
        reply = t.reply if t.action.kind == "invalid" else f"{speaker}: {t.reply}"
        messages += [{"role": "assistant", "content": t.raw if t.raw is not None else t.doctor},
                     {"role": "user", "content": reply}]
    if turn == max_turns:
        notice = SCHEMA_FINAL_NOTICE if schema else FINAL_NOTICE
        messages[-1] = {"role": "user", "content": f"{messages[-1]['content']}\n\n{notice}"}
    return messages


class LLMDoctor:
    """Each turn is one gateway call (purpose `doctor-turn-N`), recorded before it is used.
    `actions="schema"`: the call carries the turn's `DoctorTurn` json_schema and the reply is read as a move."""

    def __init__(self, gateway, recorder, memory_prefix: str = "", actions: str = "text"):
        self.gateway, self.recorder, self.memory_prefix = gateway, recorder, memory_prefix
        self.schema = actions == "schema"

    async def speak(self, view: OsceView, turns: list[DialogueTurn], turn: int,
                    max_turns: int) -> str | SchemaSpeech:
        messages = doctor_messages(view, turns, turn, max_turns, self.memory_prefix, self.schema)
        final = turn == max_turns
        params = ({"response_format": response_format(osce_action_schema(final), DOCTOR_SCHEMA_NAME)}
                  if self.schema else None)
        reply = await self.gateway.complete(messages, self.recorder, f"doctor-turn-{turn}", params=params)
        if self.schema:
            return SchemaSpeech(reply.text, parse_osce_turn(reply.text, final))
        return reply.text.strip()


# -- the sim doctor ------------------------------------------------------------------------------

SIM_QUESTIONS = (
    "What brings you in today?",
    "How did it start, and has it changed over time?",
    "Have you noticed any other symptoms?",
    "Any past medical history, medications, smoking, alcohol or recent travel?",
)
_RULE = re.compile(r"includes (.+?): favour '([^']+)'", re.IGNORECASE)


def _stems(text: str) -> set[str]:
    # whole words, plural-insensitive: prefixes would pair "difficile" with "difficulty"
    return {t[:-1] if len(t) > 3 and t.endswith("s") and not t.endswith(("ss", "us", "is")) else t
            for t in content_tokens(text)}


class SimDoctor:
    """Deterministic and model-free. It asks the opening questions, requests each recorded test group
    by name (the names only, never their values: a privilege the model doctor does not have, there so
    the measurement path runs), and on the last turn diagnoses: a memory rule (the sim backbone's
    "If the presentation includes t1, t2: favour 'D'.") whose trigger overlaps what it heard by at least
    `follow_overlap`, else the entry of `differential` (a closed label space, like MCQ options) whose
    words best overlap the dialogue. It never reads the case's diagnosis."""

    def __init__(self, differential: list[str], test_menu: tuple[str, ...] = (), memory_prefix: str = "",
                 follow_overlap: float = 0.25):
        self.differential = sorted(differential, key=str.lower)
        self.test_menu = tuple(test_menu)
        self.memory_prefix = memory_prefix
        self.follow_overlap = follow_overlap

    def plan(self, max_turns: int) -> list[str]:
        steps = list(SIM_QUESTIONS[:2]) + [f"REQUEST TEST: {t}" for t in self.test_menu] + list(SIM_QUESTIONS[2:])
        return steps[: max(max_turns - 1, 0)]

    async def speak(self, view: OsceView, turns: list[DialogueTurn], turn: int, max_turns: int) -> str:
        plan = self.plan(max_turns)
        if turn <= len(plan) and turn < max_turns:
            return plan[turn - 1]
        heard = " ".join([view.objective] + [t.reply or "" for t in turns])
        return f"Thank you. DIAGNOSIS READY: {self.diagnose(heard)}"

    def diagnose(self, heard: str) -> str:
        words = content_tokens(heard)
        best_rule: tuple[float, str] | None = None
        for terms, diagnosis in _RULE.findall(self.memory_prefix):
            overlap = trigger_overlap([t.strip().lower() for t in terms.split(",") if t.strip()], words)
            if overlap >= self.follow_overlap and (best_rule is None or overlap > best_rule[0]):
                best_rule = (overlap, diagnosis)
        if best_rule is not None:
            return best_rule[1]
        if not self.differential:
            return "undetermined"
        stems = _stems(heard)

        def score(d: str) -> tuple[float, int]:
            own = _stems(d)
            hits = len(own & stems)
            return (hits / len(own) if own else 0.0, hits)

        return max(self.differential, key=lambda d: (score(d), [-ord(c) for c in d.lower()]))
