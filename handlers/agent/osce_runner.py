"""Running AgentClinic OSCE cases end to end: dialogue, grading, per-case results and metrics.

With a gateway (openai / record) the doctor, the patient and the judge are model calls, recorded
through the run log under the case id (stages `act` for the doctor, `patient`, `judge`); without
one (sim) the sim doctor, the rule-based patient and the string-match grader run offline. The
measurement tool is the same in both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from grandrounds.handlers.agent.osce_dialogue import DialogueResult, LLMDoctor, SimDoctor, run_osce_dialogue
from grandrounds.handlers.environments.agentclinic_osce import LLMPatient, MeasurementTool, OsceCase, RulePatient
from grandrounds.handlers.environments.osce_grading import Judgement, judge
from grandrounds.handlers.llm.runlog import RunLog


@dataclass(frozen=True)
class OsceResult:
    case_id: str
    status: str
    """diagnosed, no_diagnosis (turn budget spent) or failed (a model was unreachable)."""
    diagnosis: str | None
    correct_diagnosis: str
    correct: bool
    judge: str
    """llm or string-match."""
    judge_reason: str
    turns: int
    questions: int
    tests_requested: list[str]
    tokens: int
    doctor_tokens: int
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


async def run_osce_case(case: OsceCase, max_turns: int, gateway=None, log: RunLog | None = None,
                        differential: list[str] | None = None, memory_prefix: str = "",
                        judge_gateway=None, actions: str = "text") -> tuple[OsceResult, DialogueResult]:
    """`judge_gateway`: a separate moderator model (AgentClinic's moderator_llm); default the run's.
    `actions`: how the model doctor's turns are decoded (`text`, or `schema`: json_schema moves)."""
    measurement = MeasurementTool(case)
    if gateway is None:
        # NEJM cases carry their five answers: the sim chooses among them, as the sim backbone does
        # with MCQ options; MedQA cases have none, so it uses the file's diagnosis vocabulary.
        doctor = SimDoctor(list(case.options) or differential or [], case.test_menu, memory_prefix)
        patient = RulePatient(case)
    else:
        doctor = LLMDoctor(gateway, log.recorder(case.case_id, "act"), memory_prefix, actions)
        patient = LLMPatient(case, gateway, log.recorder(case.case_id, "patient"))
    dialogue = await run_osce_dialogue(case.view(), doctor, patient, measurement, max_turns)
    if dialogue.status == "diagnosed":
        verdict = await judge(dialogue.diagnosis, case.correct_diagnosis, judge_gateway or gateway,
                              log.recorder(case.case_id, "judge") if log else None,
                              doctor_turn=dialogue.turns[-1].doctor)
    else:
        verdict = Judgement(False, "string-match", dialogue.error or "no diagnosis")
    result = OsceResult(
        case_id=case.case_id, status=dialogue.status, diagnosis=dialogue.diagnosis,
        correct_diagnosis=case.correct_diagnosis, correct=verdict.correct, judge=verdict.method,
        judge_reason=verdict.reason, turns=len(dialogue.turns), questions=dialogue.questions,
        tests_requested=dialogue.tests_requested,
        tokens=log.case_tokens(case.case_id) if log else 0,
        doctor_tokens=log.case_tokens(case.case_id, ("act",)) if log else 0, error=dialogue.error)
    return result, dialogue


async def run_osce_cases(cases: list[OsceCase], max_turns: int, gateway=None, log: RunLog | None = None,
                         differential: list[str] | None = None,
                         on_case: Callable[[OsceResult], None] | None = None,
                         judge_gateway=None, actions: str = "text") -> list[OsceResult]:
    """Strictly in order, one case at a time (so recorded exchanges replay in the same order)."""
    out = []
    for case in cases:
        result, _ = await run_osce_case(case, max_turns, gateway, log, differential, judge_gateway=judge_gateway,
                                      actions=actions)
        out.append(result)
        if on_case is not None:
            on_case(result)
    return out

