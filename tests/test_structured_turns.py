"""Schema-decoded turns beyond MCQ (issue 20, item 1): the AgentClinic doctor and the react FHIR loop.

Each turn is sent with a json_schema of its legal moves; the move read back is rendered into the
protocol's own text (AgentClinic: "REQUEST TEST: X", "DIAGNOSIS READY: Y") before the patient, the
measurement tool or the judge see it; an off-schema reply gets the corrective observation. The
official MedAgentBench protocol stays text (`--actions schema` with it is refused).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from fake_openai_server import FakeOpenAI
from grandrounds.handlers.agent.actions import (fhir_action_schema, osce_action_schema, parse_fhir_schema_turn,
                                                parse_osce_turn)
from grandrounds.handlers.llm.gateway import LLMGateway, RetryPolicy
from grandrounds.handlers.llm.transport import OpenAITransport
from llm_helpers import SECRET

GOLD = "Myasthenia gravis"
CASE = {"OSCE_Examination": {
    "Objective_for_Doctor": "Assess and diagnose the patient presenting with double vision and weakness.",
    "Patient_Actor": {
        "Demographics": "35-year-old female",
        "History": "The patient reports a 1-month history of double vision and difficulty climbing stairs.",
        "Symptoms": {"Primary_Symptom": "Double vision", "Secondary_Symptoms": ["Weakness in upper limbs"]},
        "Past_Medical_History": "None.", "Social_History": "Non-smoker.", "Review_of_Systems": "Denies chest pain."},
    "Physical_Examination_Findings": {"Vital_Signs": {"Blood_Pressure": "125/80 mmHg"}},
    "Test_Results": {"Electromyography": {"Findings": "Decreased muscle response with repetitive stimulation"}},
    "Correct_Diagnosis": GOLD}}


def _move(action: dict, reasoning: str = "Weighing the findings.") -> str:
    return json.dumps({"reasoning": reasoning, "action": action})


# --- the schemas and how a reply is read back ---------------------------------------------------------


def test_the_doctor_schema_offers_question_test_or_diagnosis_and_only_the_diagnosis_last():
    moves = osce_action_schema(final=False)["properties"]["action"]["anyOf"]
    assert [list(m["properties"]) for m in moves] == [["question"], ["test"], ["diagnosis"]]
    final = osce_action_schema(final=True)["properties"]["action"]
    assert list(final["properties"]) == ["diagnosis"] and "anyOf" not in final
    assert parse_osce_turn(_move({"test": "EMG"}), final=False).kind == "test"
    assert parse_osce_turn(_move({"question": "Any fever?"}), final=True).kind == "invalid"  # last turn: diagnose
    two = parse_osce_turn(_move({"question": "Any fever?", "diagnosis": "Flu"}), final=False)
    assert two.kind == "invalid" and "exactly one" in two.text
    assert parse_osce_turn('{"reasoning": "cut by max_tok', final=False).kind == "invalid"


def test_the_fhir_schema_gives_each_allowed_function_its_own_arguments_and_only_finish_last():
    params = {"get_patient": {"type": "object", "properties": {"identifier": {"type": "string",
                                                                              "description": "MRN"}}},
              "post_observation": {"type": "object", "properties": {"valueString": {"type": "string"}},
                                   "required": ["valueString"]}}
    branches = fhir_action_schema(params, ["get_patient", "post_observation"])["properties"]["action"]["anyOf"]
    calls = {b["properties"]["tool"]["enum"][0]: b["properties"]["arguments"] for b in branches if "tool" in b["properties"]}
    assert calls == {"get_patient": {"type": "object", "properties": {"identifier": {"type": "string"}}},
                     "post_observation": params["post_observation"]}
    assert {"finish"} in [set(b["properties"]) for b in branches]
    assert list(fhir_action_schema(params, [])["properties"]["action"]["properties"]) == ["finish"]
    done = parse_fhir_schema_turn(_move({"finish": ["S6534835", 56]}), ["get_patient"])
    assert done.kind == "response" and done.answer == '["S6534835", 56]'  # as FINISH([...]) would carry it
    assert parse_fhir_schema_turn(_move({"tool": "get_patient", "arguments": {}}), []).kind == "invalid"
    assert parse_fhir_schema_turn(_move({"tool": "xray", "arguments": {}}), ["get_patient"]).kind == "invalid"


# --- the doctor, through the gateway to an enforcing server ------------------------------------------


class DoctorFake(FakeOpenAI):
    """Plays the doctor from scripted JSON moves (one per turn), the patient and the judge."""

    def __init__(self, moves: list[str]):
        super().__init__()
        self.moves = list(moves)

    def _text(self, kind, messages, action):
        system = messages[0]["content"]
        if system.startswith("You are a doctor"):
            return self.moves[sum(m["role"] == "assistant" for m in messages)]
        if system.startswith("You are a patient"):
            return "It started a month ago and gets worse when I climb stairs."
        if system.startswith("You are responsible"):
            return "Yes"
        raise AssertionError(system[:60])


def _osce_case(tmp_path):
    from grandrounds.handlers.environments.agentclinic_osce import load_osce_cases

    path = tmp_path / "osce.jsonl"
    path.write_text(json.dumps(CASE) + "\n")
    return load_osce_cases(path)[0]


def _run_case(server, case, actions: str, max_turns: int):
    from grandrounds.handlers.agent.osce_runner import run_osce_case
    from grandrounds.handlers.llm.runlog import RunLog
    from grandrounds.store.eventstore import EventStore

    async def go():
        gw = LLMGateway(OpenAITransport(server.base_url, SECRET), "fake-doc",
                        retry=RetryPolicy(max_attempts=1, backoff_s=0.0))
        with EventStore(":memory:") as store:
            try:
                return await run_osce_case(case, max_turns, gw, RunLog(store, "r"), actions=actions)
            finally:
                await gw.aclose()

    return asyncio.run(go())


def test_schema_doctor_moves_reach_patient_tests_and_judge_in_agentclinic_words(tmp_path):
    case = _osce_case(tmp_path)
    moves = [_move({"question": "What brings you in today?"}), _move({"test": "Electromyography"}),
             _move({"prescription": "rest"}),  # off-schema: a server that did not enforce, say
             _move({"diagnosis": GOLD})]
    with DoctorFake(moves) as server:
        result, dialogue = _run_case(server, case, "schema", max_turns=4)
        requests = list(server.requests)
    doctor = [r for r in requests if r["messages"][0]["content"].startswith("You are a doctor")]
    patient = [r for r in requests if r["messages"][0]["content"].startswith("You are a patient")]
    judge = [r for r in requests if r["messages"][0]["content"].startswith("You are responsible")]
    assert len(doctor) == 4 and all(r["response_format"]["json_schema"]["name"] == "DoctorTurn" for r in doctor)
    last = doctor[-1]["response_format"]["json_schema"]["schema"]["properties"]["action"]
    assert list(last["properties"]) == ["diagnosis"]  # the last turn offers only the diagnosis
    assert "anyOf" in doctor[0]["response_format"]["json_schema"]["schema"]["properties"]["action"]
    assert len(patient) == 1 and "What brings you in today?" in json.dumps(patient[0]["messages"])
    assert "{" not in patient[0]["messages"][-1]["content"]  # the patient hears the question, not JSON
    assert result.tests_requested == ["Electromyography"]
    assert "Decreased muscle response" in doctor[2]["messages"][-1]["content"]  # measurement came back
    assert "Format error" in doctor[3]["messages"][-1]["content"]  # the corrective observation, no crash
    assert doctor[1]["messages"][2] == {"role": "assistant", "content": moves[0]}  # its own turns, verbatim
    assert [t.doctor for t in dialogue.turns] == ["What brings you in today?", "REQUEST TEST: Electromyography",
                                                  moves[2], f"DIAGNOSIS READY: {GOLD}"]
    assert judge[0]["messages"][1]["content"].endswith(f"doctor dialogue: DIAGNOSIS READY: {GOLD}\nAre these the same?")
    assert "response_format" not in judge[0] and "response_format" not in patient[0]
    assert result.correct and result.status == "diagnosed" and result.diagnosis == GOLD


def test_text_doctor_turns_carry_no_schema(tmp_path):
    case = _osce_case(tmp_path)
    with DoctorFake(["What brings you in today?", f"DIAGNOSIS READY: {GOLD}"]) as server:
        server.schema_supported = True
        result, dialogue = _run_case(server, case, "text", max_turns=3)
        doctor = [r for r in server.requests if r["messages"][0]["content"].startswith("You are a doctor")]
    assert result.correct and all("response_format" not in r for r in doctor)
    assert all(t.raw is None and t.reasoning is None for t in dialogue.turns)


# --- the react FHIR loop ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fhir_env():
    from conftest import MAB_FUNCS, MAB_PATIENTS, MAB_TASKS, needs_medagentbench  # noqa: F401

    if not (MAB_FUNCS.exists() and MAB_PATIENTS.exists() and MAB_TASKS.exists()):
        pytest.skip("MedAgentBench data not found")
    from grandrounds.handlers.environments.medagentbench import load_functions, load_tasks
    from grandrounds.sandbox.fhir_server import FhirSandbox

    with FhirSandbox.from_file(MAB_PATIENTS) as sandbox:
        yield sandbox, load_functions(MAB_FUNCS), {c.case_id: c for c in load_tasks(MAB_TASKS)}


def test_react_fhir_turns_are_schema_decoded_and_finish_as_the_text_protocol_would(fhir_env):
    from fhir_helpers import grade_now
    from grandrounds.handlers.agent.fhir_react import run_fhir_agent
    from grandrounds.handlers.agent.react import AgentConfig
    from grandrounds.handlers.environments.medagentbench import FhirTools
    from grandrounds.handlers.llm.recorder import Recorder

    sandbox, functions, cases = fhir_env
    case = cases["mab-task1_1"]
    lookup = {"given": "Peter", "family": "Stafford", "birthdate": "1932-12-29"}
    with FakeOpenAI() as server:
        server.script = [("act", "raw:" + _move({"tool": "xray_reader", "arguments": {}})),  # off-schema
                         ("act", "raw:" + _move({"tool": "get_patient", "arguments": lookup})),
                         ("act", "raw:" + _move({"finish": ["S6534835"]}))]
        tools = FhirTools(functions, sandbox.base)

        async def go():
            gw = LLMGateway(OpenAITransport(server.base_url, SECRET), "fake-fhir",
                            retry=RetryPolicy(max_attempts=1, backoff_s=0.0))
            try:
                return await run_fhir_agent(gw, case.view(), tools, Recorder("c", "act", lambda p, m: 0),
                                            AgentConfig(max_steps=4, actions="schema"))
            finally:
                await gw.aclose()

        answer = asyncio.run(go())
        requests = list(server.requests)
    assert answer.answer == '["S6534835"]' and answer.source == "llm:schema"
    assert all(r["response_format"]["json_schema"]["name"] == "FhirTurn" for r in requests)
    branches = requests[0]["response_format"]["json_schema"]["schema"]["properties"]["action"]["anyOf"]
    assert sorted(b["properties"]["tool"]["enum"][0] for b in branches if "tool" in b["properties"]) == sorted(tools.names)
    assert "Format error" in requests[1]["messages"][-1]["content"]  # the corrective observation
    assert [json.loads(s.content) for s in answer.steps if s.kind == "tool"] == [{"name": "get_patient",
                                                                                 "arguments": lookup}]
    assert grade_now(case, tools.trajectory, sandbox.base).correct


def test_official_medagentbench_protocol_refuses_schema_actions(tmp_path):
    from conftest import MAB_TASKS
    from fhir_helpers import run_fhir

    if not MAB_TASKS.exists():
        pytest.skip("MedAgentBench data not found")
    code, out = run_fhir(MAB_TASKS, tmp_path / "x.duckdb", "--actions", "schema")
    assert code == 2 and "official MedAgentBench protocol" in out["error"], out
