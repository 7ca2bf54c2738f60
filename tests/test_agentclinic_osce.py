"""AgentClinic OSCE: loader, measurement tool, patients, the dialogue, grading, and the CLI for
the sim, openai (fake server) and record backends."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from click.testing import CliRunner

from conftest import AC_MEDQA, AC_MEDQA_EXT, AC_NEJM, AC_NEJM_EXT, AGENTCLINIC
from fake_openai_server import FakeOpenAI
from grandrounds.cli import main
from grandrounds.handlers.agent.osce_dialogue import SimDoctor, parse_doctor, run_osce_dialogue
from grandrounds.handlers.agent.osce_runner import run_osce_case
from grandrounds.handlers.backbones.sim import rule_text
from grandrounds.handlers.cases import CaseFileError
from grandrounds.handlers.environments.agentclinic_osce import (NEJM_OBJECTIVE, MeasurementTool, RulePatient,
                                                    diagnosis_vocabulary, load_osce_cases)
from grandrounds.handlers.environments.osce_grading import judge, normalise, string_match
from grandrounds.handlers.llm.errors import ModelOutage
from grandrounds.handlers.llm.gateway import LLMGateway, RetryPolicy
from grandrounds.handlers.llm.runlog import RunLog
from grandrounds.handlers.llm.transport import OpenAITransport
from llm_helpers import SECRET
from grandrounds.store.eventstore import EventStore

needs_agentclinic = pytest.mark.skipif(
    not all(p.exists() for p in (AC_MEDQA, AC_MEDQA_EXT, AC_NEJM, AC_NEJM_EXT)),
    reason=f"AgentClinic data not found under {AGENTCLINIC} (../shared/data)")

GOLD = "Myasthenia gravis"
CASE = {"OSCE_Examination": {
    "Objective_for_Doctor": "Assess and diagnose the patient presenting with double vision and weakness.",
    "Patient_Actor": {
        "Demographics": "35-year-old female",
        "History": "The patient reports a 1-month history of double vision and difficulty climbing stairs. "
                   "Symptoms worsen after activity and improve after rest.",
        "Symptoms": {"Primary_Symptom": "Double vision", "Secondary_Symptoms": ["Weakness in upper limbs"]},
        "Past_Medical_History": "No significant past medical history.",
        "Social_History": "Non-smoker, drinks wine occasionally.",
        "Review_of_Systems": "Denies chest pain or recent infections."},
    "Physical_Examination_Findings": {"Vital_Signs": {"Blood_Pressure": "125/80 mmHg"},
                                      "Neurological_Examination": {"Cranial_Nerves": "Ptosis worse with upward gaze."}},
    "Test_Results": {"Blood_Tests": {"Acetylcholine_Receptor_Antibodies": "Present (elevated)"},
                     "Electromyography": {"Findings": "Decreased muscle response with repetitive stimulation"}},
    "Correct_Diagnosis": GOLD}}
OTHER = json.loads(json.dumps(CASE))
OTHER["OSCE_Examination"]["Correct_Diagnosis"] = "Guillain-Barre syndrome"


@pytest.fixture
def cases_file(tmp_path):
    p = tmp_path / "osce.jsonl"
    p.write_text(json.dumps(CASE) + "\n" + json.dumps(OTHER) + "\n")
    return p


# --- loader --------------------------------------------------------------------------------


@needs_agentclinic
def test_loader_reads_every_real_file():
    counts = {p.name: len(load_osce_cases(p)) for p in (AC_MEDQA, AC_MEDQA_EXT, AC_NEJM, AC_NEJM_EXT)}
    assert counts == {"agentclinic_medqa.jsonl": 107, "agentclinic_medqa_extended.jsonl": 214,
                      "agentclinic_nejm.jsonl": 15, "agentclinic_nejm_extended.jsonl": 120}
    first = load_osce_cases(AC_MEDQA)[0]
    assert first.case_id == "medqa-001" and first.correct_diagnosis == GOLD
    assert first.test_menu == ("Blood_Tests", "Electromyography", "Imaging")
    assert GOLD.lower() not in first.view().model_dump_json().lower()
    assert len(diagnosis_vocabulary(load_osce_cases(AC_MEDQA))) == 104  # 107 cases, a few repeat
    nejm = load_osce_cases(AC_NEJM)[0]
    assert nejm.objective == NEJM_OBJECTIVE and len(nejm.options) == 5 and nejm.correct_diagnosis in nejm.options
    assert nejm.findings  # readings split out of the physical_exams prose
    # the 15-case file stores "correct" as strings: exactly one is still found per case
    assert all(c.correct_diagnosis in c.options for c in load_osce_cases(AC_NEJM))


def test_loader_errors_name_line_and_field(tmp_path):
    p = tmp_path / "bad.jsonl"
    broken = json.loads(json.dumps(CASE))
    del broken["OSCE_Examination"]["Correct_Diagnosis"]
    p.write_text(json.dumps(CASE) + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(CaseFileError) as e:
        load_osce_cases(p)
    assert e.value.line == 2 and e.value.field == "OSCE_Examination.Correct_Diagnosis"
    p.write_text(json.dumps(CASE) + "\n{not json\n")
    with pytest.raises(CaseFileError, match=r"bad.jsonl:2: not valid JSON"):
        load_osce_cases(p)
    two = {"question": "q", "patient_info": "p", "physical_exams": "x",
           "answers": [{"text": "A", "correct": True}, {"text": "B", "correct": "True"}]}
    p.write_text(json.dumps(two) + "\n")
    with pytest.raises(CaseFileError, match="2 answers marked correct"):
        load_osce_cases(p)
    p.write_text(json.dumps({"hello": 1}) + "\n")
    with pytest.raises(CaseFileError, match="neither an OSCE case"):
        load_osce_cases(p)


# --- environment ---------------------------------------------------------------------------


def test_measurement_tool_returns_recorded_results_or_normal(cases_file):
    tool = MeasurementTool(load_osce_cases(cases_file)[0])
    assert "Decreased muscle response" in tool.request("EMG")
    assert tool.request("Blood tests") == "RESULTS: Blood Tests > Acetylcholine Receptor Antibodies: Present (elevated)"
    assert "125/80" in tool.request("blood pressure") and "Acetylcholine" not in tool.request("blood pressure")
    assert tool.request("Troponin").startswith("RESULTS: NORMAL READINGS")
    assert tool.request("").startswith("RESULTS: NORMAL READINGS")


def test_rule_patient_answers_from_its_facts(cases_file):
    case = load_osce_cases(cases_file)[0]
    patient = RulePatient(case)
    ask = lambda q: asyncio.run(patient.answer(q, []))  # noqa: E731
    assert "double vision" in ask("What brings you in today?")
    assert "Non-smoker" in ask("Do you smoke?")
    assert "rest" in ask("Does it get better with rest?")
    assert all(GOLD.lower() not in ask(q).lower() for q in ("What is wrong with me?", "Any diagnosis?"))


def test_parse_doctor():
    assert parse_doctor("Okay. DIAGNOSIS READY: [Myasthenia gravis].").text == "Myasthenia gravis"
    t = parse_doctor("Let's check. REQUEST TEST: Chest_X-Ray\nThanks")
    assert (t.kind, t.text) == ("test", "Chest_X-Ray")
    assert parse_doctor("REQUEST TEST: CBC then DIAGNOSIS READY: anemia").kind == "diagnosis"
    assert parse_doctor("How long have you had it?").kind == "question"


# --- grading -------------------------------------------------------------------------------


def test_normaliser():
    assert normalise("The Hirschsprung’s disease.") == "hirschsprung disease"
    assert normalise("An acute, interstitial-nephritis!") == "acute interstitial nephritis"
    assert normalise("Sjögren syndrome") == "sjogren syndrome"


@pytest.mark.parametrize("pred, gold, ok", [
    ("Myasthenia gravis", GOLD, True),
    ("DIAGNOSIS: generalised myasthenia gravis, seropositive", GOLD, True),
    ("Hirschsprung disease", "Hirschsprung’s disease", True),
    ("PML", "Progressive multifocal encephalopathy (PML)", True),
    ("progressive multifocal encephalopathy", "Progressive multifocal encephalopathy (PML)", True),
    ("Epidermoid cysts", "Epidermoid cyst", True),
    ("myasthenia gravis", "Ocular myasthenia gravis", True),
    ("disease", "Hirschsprung disease", False),
    ("Lambert-Eaton syndrome", GOLD, False),
    ("Myasthenia gravis or Lambert-Eaton syndrome", GOLD, False),
    ("", GOLD, False),
])
def test_string_match(pred, gold, ok):
    assert string_match(pred, gold) is ok


def test_judge_without_a_model_uses_the_string_match():
    v = asyncio.run(judge("myasthenia gravis", GOLD))
    assert v.correct and v.method == "string-match" and "no judge model" in v.reason
    assert not asyncio.run(judge(None, GOLD)).correct


# --- dialogue (sim) ------------------------------------------------------------------------


def test_sim_doctor_requests_tests_and_follows_a_memory_rule(cases_file):
    case = load_osce_cases(cases_file)[0]
    differential = ["Guillain-Barre syndrome", "Multiple sclerosis"]  # the gold is not even offered
    result, dialogue = asyncio.run(run_osce_case(case, 8, differential=differential))
    assert dialogue.tests_requested == ["Blood_Tests", "Electromyography"]
    assert any("Acetylcholine" in (t.reply or "") for t in dialogue.turns)
    assert result.status == "diagnosed" and not result.correct
    memory = rule_text(["double", "vision", "ptosis", "weakness"], GOLD)
    result, _ = asyncio.run(run_osce_case(case, 8, differential=differential, memory_prefix=memory))
    assert result.diagnosis == GOLD and result.correct and result.judge == "string-match"
    # a rule whose trigger the dialogue does not overlap is not followed
    memory = rule_text(["fever", "rash", "arthralgia", "cough"], GOLD)
    assert asyncio.run(run_osce_case(case, 8, differential=differential, memory_prefix=memory))[0].diagnosis != GOLD


def test_turn_budget_bounds_the_dialogue(cases_file):
    case = load_osce_cases(cases_file)[0]

    class Chatty:
        async def speak(self, view, turns, turn, max_turns):
            return "Tell me more."

    d = asyncio.run(run_osce_dialogue(case.view(), Chatty(), RulePatient(case), MeasurementTool(case), 3))
    assert d.status == "no_diagnosis" and len(d.turns) == 3 and d.diagnosis is None
    one = SimDoctor(["x"], case.test_menu)
    d = asyncio.run(run_osce_dialogue(case.view(), one, RulePatient(case), MeasurementTool(case), 1))
    assert d.status == "diagnosed" and len(d.turns) == 1


def _cli(args, env=None):
    r = CliRunner().invoke(main, ["agentclinic", *args, "--json"], env=env or {})
    return r.exit_code, json.loads(r.stdout.strip().splitlines()[-1])


@needs_agentclinic
def test_sim_end_to_end_on_the_real_osce_file():
    code, out = _cli([str(AC_MEDQA)])
    assert code == 0, out
    assert out["cases"] == 107 and out["metrics"]["tc"] == 100.0
    assert out["correct"] == sum(r["correct"] for r in out["results"]) and 0 < out["correct"] < 107
    assert out["metrics"]["judged_by_string_match"] == 107 and "llm" not in out
    assert any("not a clinical measure" in n for n in out["notes"])
    assert sum(bool(r["tests_requested"]) for r in out["results"]) == 105  # 2 cases record no tests
    assert _cli([str(AC_MEDQA)])[1] == out  # deterministic
    code, nejm = _cli([str(AC_NEJM_EXT), "--limit", "10", "--max-turns", "4"])
    assert code == 0 and nejm["cases"] == 10 and all(r["turns"] <= 4 for r in nejm["results"])


def test_cli_bad_input_exits_2(cases_file, tmp_path):
    code, out = _cli([str(cases_file), "--backbone", "openai"])
    assert code == 2 and "--model" in out["error"]
    code, out = _cli([str(tmp_path / "missing.jsonl")])
    assert code == 2 and "file not found" in out["error"]
    code, out = _cli([str(cases_file), "--backbone", "record", "--record-from", "nope", "--db",
                      str(tmp_path / "r.duckdb")])
    assert code == 2 and "no run 'nope'" in out["error"]


# --- openai (fake server) and record -------------------------------------------------------


class OsceFake(FakeOpenAI):
    """Plays the doctor from `doctor` (one reply per turn), the patient, and the judge."""

    def __init__(self, doctor: list[str], verdict: str = "Yes"):
        super().__init__()
        self.doctor, self.verdict = list(doctor), verdict

    def _text(self, kind, messages, action):
        system = messages[0]["content"]
        if system.startswith("You are a doctor"):
            turn = sum(m["role"] == "assistant" for m in messages)
            return self.doctor[turn] if turn < len(self.doctor) else "DIAGNOSIS READY: Unknown"
        if system.startswith("You are a patient"):
            return "Patient: It started a month ago and gets worse when I climb stairs."
        if system.startswith("You are responsible"):
            return self.verdict
        raise AssertionError(f"unexpected prompt {system[:60]!r}")


DOCTOR = ["What brings you in today?", "REQUEST TEST: EMG", "DIAGNOSIS READY: Myasthenia gravis"]


@pytest.mark.parametrize("actions", ["text", "auto"])
def test_openai_path_records_every_exchange_and_record_replays_it(cases_file, tmp_path, actions):
    """In AgentClinic's text turns, and (auto, the fake enforcing json_schema) in schema-decoded ones:
    the same dialogue, the same words for the patient, the measurement tool and the judge."""
    db = str(tmp_path / "osce.duckdb")
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    with OsceFake(DOCTOR * 2) as server:
        code, live = _cli([str(cases_file), "--backbone", "openai", "--model", "fake-doc", "--base-url",
                           server.base_url, "--db", db, "--run-id", "live", "--max-turns", "5",
                           "--actions", actions], env)
        requests = list(server.requests)
    assert code == 0, live
    mode = "text" if actions == "text" else "schema"
    assert live["actions"]["mode"] == mode
    doctor_formats = {(r.get("response_format") or {}).get("json_schema", {}).get("name")
                      for r in requests if r["messages"][0]["content"].startswith("You are a doctor")}
    assert doctor_formats == ({None} if mode == "text" else {"DoctorTurn"})
    first, second = live["results"]
    assert first["correct"] and first["judge"] == "llm" and first["judge_reason"] == "moderator said 'Yes'"
    assert first["tests_requested"] == ["EMG"] and first["turns"] == 3
    assert second["correct"]  # the fake judge says so: the verdict is the model's, not the string match's
    assert live["llm"]["calls"] == 10 and live["llm"]["run_id"] == "live"  # (3 doctor + 1 patient + 1 judge) x 2
    assert live["metrics"]["tokens_per_correct_task"] > live["metrics"]["doctor_tokens_per_correct_task"] > 0
    doctor_prompts = [r for r in requests if r["messages"][0]["content"].startswith("You are a doctor")]
    assert "Decreased muscle response" in doctor_prompts[2]["messages"][-1]["content"]
    seen_by_actors = json.dumps([r["messages"] for r in requests
                                 if not r["messages"][0]["content"].startswith("You are responsible")])
    assert GOLD not in seen_by_actors and "Guillain" not in seen_by_actors  # only the judge sees the gold
    judge_req = [r for r in requests if r["messages"][0]["content"].startswith("You are responsible")][0]
    assert "response_format" not in judge_req  # the official moderator answers in text: Yes or No
    assert judge_req["messages"][1]["content"] == (f"\nHere is the correct diagnosis: {GOLD}\n Here was the doctor "
                                                   "dialogue: DIAGNOSIS READY: Myasthenia gravis\nAre these the same?")
    counters = [re.search(r"You have asked (\d+) questions so far", r["messages"][0]["content"]).group(1)
                for r in doctor_prompts[:3]]
    assert counters == ["0", "1", "2"]  # AgentClinic's question counter in the doctor prompt
    with EventStore(db) as s:
        assert sum(1 for _ in s.iter("live", types=["llm.exchange"])) == 10
        fingerprint = s.fingerprint("live")
    assert SECRET not in open(db, "rb").read().decode("latin-1")

    code, rec = _cli([str(cases_file), "--backbone", "record", "--record-from", "live", "--db", db,
                      "--max-turns", "5"], env)
    assert code == 0, rec
    assert rec["actions"]["mode"] == mode  # the recorded run's mode, never re-probed
    assert rec["results"] == live["results"] and rec["llm"]["run_id"] == "live-record"
    assert rec["llm"]["fingerprint"] == fingerprint
    code, div = _cli([str(cases_file), "--backbone", "record", "--record-from", "live", "--db", db],
                     env)  # 20 turns: a different doctor prompt, nothing recorded to serve
    assert code == 1 and "diverged" in div["error"]


def test_judge_garbage_falls_back_to_the_string_match(cases_file, tmp_path):
    case = load_osce_cases(cases_file)[0]

    async def go(server, diagnosis):
        gw = LLMGateway(OpenAITransport(server.base_url, SECRET), "fake-judge",
                        retry=RetryPolicy(max_attempts=1, backoff_s=0.0))
        with EventStore(":memory:") as store:
            log = RunLog(store, "j")
            try:
                return await judge(diagnosis, case.correct_diagnosis, gw, log.recorder(case.case_id, "judge")), log
            finally:
                await gw.aclose()

    # agentclinic.py: correct iff the reply, whitespace collapsed and lower-cased, is exactly "yes"
    with OsceFake([], verdict="Yes, I think they are the same.") as server:
        v, log = asyncio.run(go(server, "Generalized myasthenia gravis"))
        assert v.method == "llm" and not v.correct and log.calls == 1
    with OsceFake([], verdict="YES") as server:
        v, _ = asyncio.run(go(server, "Lambert-Eaton syndrome"))
        assert v.method == "llm" and v.correct  # the moderator's word, not the string match's
    with OsceFake([], verdict="No") as server:
        server.script.append(("act", "401"))  # judge unreachable: an outage, not a grade (issue 13 item 4)
        with pytest.raises(ModelOutage, match="auth"):
            asyncio.run(go(server, "myasthenia gravis"))
        v, _ = asyncio.run(go(server, "myasthenia gravis"))
        assert v.method == "llm" and not v.correct


def test_doctor_that_never_diagnoses_is_a_timeout(cases_file, tmp_path):
    with OsceFake(["Tell me more."] * 10) as server:
        code, out = _cli([str(cases_file), "--backbone", "openai", "--model", "m", "--base-url", server.base_url,
                          "--db", str(tmp_path / "t.duckdb"), "--max-turns", "2", "--limit", "1"],
                         {"OPENAI_API_KEY": SECRET})
    assert code == 0, out
    r = out["results"][0]
    assert r["status"] == "no_diagnosis" and not r["correct"] and r["turns"] == 2
    assert out["metrics"]["er"] == 0.0 and out["metrics"]["tokens_per_correct_task"] is None
    last_doctor = [r for r in server.requests if r["messages"][0]["content"].startswith("You are a doctor")][-1]
    assert "final question" in last_doctor["messages"][-1]["content"]  # the final-turn notice


def test_string_fallback_refuses_negations_hedges_and_non_prefixes():
    from grandrounds.handlers.environments.osce_grading import string_match

    assert string_match("Hodgkin lymphoma", "Hodgkin lymphoma")
    assert not string_match("Non-Hodgkin lymphoma", "Hodgkin lymphoma")
    assert string_match("Non-Hodgkin lymphoma", "Non-Hodgkin lymphoma")
    assert not string_match("Not tuberculosis", "Tuberculosis")
    assert not string_match("Tuberculosis ruled out", "Tuberculosis")
    assert not string_match("No evidence of tuberculosis", "Tuberculosis")
    for hedge in ("Tuberculosis vs sarcoidosis", "Tuberculosis or sarcoidosis", "Tuberculosis/sarcoidosis",
                  "Tuberculosis versus lymphoma"):
        assert not string_match(hedge, "Tuberculosis"), hedge
    assert string_match("Pulmonary tuberculosis", "Tuberculosis")


def test_measurement_reader_answers_every_recorded_exam_and_test():
    from conftest import SHARED_DATA
    from grandrounds.handlers.environments.agentclinic_osce import NORMAL

    path = SHARED_DATA / "agentclinic" / "agentclinic_medqa.jsonl"
    if not path.exists():
        pytest.skip("AgentClinic data not present")
    cases = load_osce_cases(path)
    answered = sum(NORMAL not in MeasurementTool(c).request("Physical examination") for c in cases)
    assert answered == len(cases) == 107  # every case records physical examination findings
    for c in cases:
        ct = [f for f in c.findings if "Chest_CT" in f.path]
        xray = [f for f in c.findings if any(p.lower() == "chest_x-ray" for p in f.path)]
        if ct and not xray:  # a chest CT is not a chest X-ray
            assert NORMAL in MeasurementTool(c).request("Chest_X-Ray")
            assert ct[0].value in MeasurementTool(c).request("chest ct")
        if xray:
            assert xray[0].value in MeasurementTool(c).request("REQUEST TEST: chest x-ray".split(": ")[1])
    first = cases[0]
    assert MeasurementTool(first).request("vital signs") == MeasurementTool(first).request("VITAL_SIGNS")


def test_test_results_join_the_patients_history_and_a_separate_judge_model(cases_file, tmp_path):
    db = str(tmp_path / "j.duckdb")
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    doctor = ["REQUEST TEST: EMG", "What brings you in today?", "DIAGNOSIS READY: Myasthenia gravis"]
    with OsceFake(doctor) as actors, OsceFake([], verdict="No") as moderator:
        code, out = _cli([str(cases_file), "--backbone", "openai", "--model", "fake-doc", "--base-url",
                          actors.base_url, "--judge-model", "fake-judge", "--judge-base-url", moderator.base_url,
                          "--db", db, "--max-turns", "5", "--limit", "1"], env)
        patient = [r for r in actors.requests if r["messages"][0]["content"].startswith("You are a patient")][0]
        judged_by = [r["model"] for r in moderator.requests]
        actors_judged = [r for r in actors.requests if r["messages"][0]["content"].startswith("You are responsible")]
    assert code == 0, out
    assert patient["messages"][1]["content"].startswith("Measurement: RESULTS:"), patient["messages"][1]  # the EMG result is in the patient's history
    assert judged_by == ["fake-judge"] and actors_judged == []  # the separate moderator judged, the doctor's did not
    assert out["results"][0]["correct"] is False and out["results"][0]["judge"] == "llm"
