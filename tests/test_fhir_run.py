"""MedAgentBench FHIR tasks through `grandrounds run --env medagentbench`: the five stages with memory,
recorded in the event log, graded by the official refsol rules against the local sandbox."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import MAB_FUNCS as FUNCS, MAB_PATIENTS as PATIENTS, MAB_TASKS as TASKS, needs_medagentbench, copy_db
from fhir_helpers import FhirFake, TYPES, invoke_json, offline_tasks_file, run_fhir, ungated_policy
from llm_helpers import SECRET
from grandrounds.store.eventstore import EventStore

pytestmark = needs_medagentbench



@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return offline_tasks_file(tmp_path_factory.mktemp("mab"))


@pytest.fixture(scope="module")
def sim_run(tasks, tmp_path_factory):
    db = tmp_path_factory.mktemp("run") / "fhir.duckdb"
    # Without the k-subjects gate (tests/test_privacy_freetext.py): two tasks per template are too few patients
    # for a template's words to pass it, and these tests read what the rules and feedback say.
    code, out = run_fhir(tasks, db, "--policy", ungated_policy(db.parent))
    assert code == 0, out
    return db, out


def test_fhir_tasks_run_through_the_five_stages_and_are_recorded(sim_run):
    db, out = sim_run
    assert out["environment"] == "medagentbench" and out["cases"] == 8 and out["policy"] == "evo-medagent"
    assert out["per_task_type"] == {t: {"tasks": 2, "correct": 2} for t in TYPES}
    with EventStore(str(db), read_only=True) as s:
        events = s.read(out["run_id"])
    assert "127.0.0.1" not in json.dumps([e.payload for e in events])  # nothing of the sandbox's port
    assert events[0].meta["environment"]["patients"]["path"] == str(PATIENTS.resolve())
    by_case: dict[str, list] = {}
    for e in events[1:]:
        if e.type != "embeddings.recorded":  # recorded inputs between the stages' events
            by_case.setdefault(e.case_id, []).append(e)
    first = [e.type for e in by_case["mab-task1_1"]]
    assert first[:4] == ["case.received", "memory.retrieved", "answer.given", "feedback.recorded"]
    assert {"reflection.recorded", "episode.stored", "rule.added"} <= set(first) and first[-1] == "case.completed"

    received = by_case["mab-task1_1"][0].payload["case"]
    assert received["kind"] == "fhir" and received["sol"] == ["S6534835"]  # the whole case, gold for feedback
    answer = by_case["mab-task1_1"][2].payload
    assert answer["answer"] == '["S6534835"]' and answer["source"] == "sim:fhir"
    get = json.loads(answer["steps"][0]["content"])
    assert get["method"] == "GET" and get["accepted"] and get["name"] == "get_patient"
    assert get["url"].startswith("http://localhost:8080/fhir/Patient?")  # the official base, not the sandbox's
    fb = by_case["mab-task1_1"][3].payload
    assert fb["correct"] is True and fb["gold"] == "refsol:task1: answer matches"

    post_case = next(es for cid, es in by_case.items() if cid == "mab-task3_1")
    answer3 = next(e.payload for e in post_case if e.type == "answer.given")
    post = json.loads(next(s["content"] for s in answer3["steps"] if s["kind"] == "tool"))
    assert post["method"] == "POST" and post["url"] == "http://localhost:8080/fhir/Observation"
    assert post["payload"]["valueString"] == "118/77 mmHg" and answer3["answer"] == "[]"

    # Memory is written and read: the second task of a template retrieves the first's rule.
    retrieved = next(e.payload for e in by_case["mab-task1_2"] if e.type == "memory.retrieved")
    assert [r["text"] for r in retrieved["rules"]][0].startswith("For tasks like 'mrn name dob exist answer'")
    episode = next(e.payload for e in by_case["mab-task1_1"] if e.type == "episode.stored")
    assert episode["descriptor"].startswith("What’s the MRN of the patient") and episode["gold"] == "refsol:task1"
    assert out["memory"]["episodes"] == 8 and out["memory"]["rules"] == 4  # one rule per task template


def test_accuracy_matches_the_medagentbench_command(sim_run, tasks):
    _, out = sim_run
    code, bench = invoke_json(["medagentbench", str(tasks), "--funcs", str(FUNCS), "--patients", str(PATIENTS)])
    assert code == 0, bench
    assert bench["graded"] == out["cases"] and bench["correct"] == out["correct"] and out["accuracy"] == 1.0
    assert {k: v["correct"] for k, v in bench["per_task_type"].items()} == \
        {k: v["correct"] for k, v in out["per_task_type"].items()}


def test_two_runs_give_the_same_fingerprint_and_verify_is_identical(sim_run, tasks, tmp_path):
    db, out = sim_run
    code, again = run_fhir(tasks, tmp_path / "again.duckdb", "--policy", ungated_policy(tmp_path))  # another sandbox, port
    assert code == 0 and again["fingerprint"] == out["fingerprint"] and again["run_id"] == out["run_id"]
    code, ver = invoke_json(["verify", "--db", str(db), out["run_id"]])
    assert code == 0, ver
    assert ver["identical"] and ver["replayed_fingerprint"] == out["fingerprint"] and ver["cases"] == 8
    # Order replays rebuild the environment too (more in test_fhir_replay.py).
    copy = tmp_path / "replay.duckdb"
    copy_db(db, copy)
    code, rep = invoke_json(["replay", "--db", str(copy), "--from", out["run_id"], "--permutations", "1"])
    assert code == 0 and rep["environment"] == "medagentbench" and rep["runs"][0]["accuracy"] == 1.0, rep


def test_policy_none_runs_fhir_tasks_without_writing_memory(tasks, tmp_path):
    code, out = run_fhir(tasks, tmp_path / "none.duckdb", "--policy", "none", "--task-type", "3", "--task-type", "8")
    assert code == 0, out
    assert out["cases"] == 4 and out["accuracy"] == 1.0 and out["memory"]["episodes"] == out["memory"]["rules"] == 0
    assert set(out["per_task_type"]) == {"3", "8"}


def test_verify_refuses_when_the_environment_files_changed(tasks, tmp_path):
    funcs = tmp_path / "funcs_v1.json"
    shutil.copy(FUNCS, funcs)
    db = tmp_path / "v.duckdb"
    code, out = run_fhir(tasks, db, "--limit", "1", funcs=funcs)
    assert code == 0, out
    funcs.write_text(funcs.read_text().replace("Patient", "Patient "))
    code, ver = invoke_json(["verify", "--db", str(db), out["run_id"]])
    assert code == 2 and "has changed since the run" in ver["error"] and str(funcs) in ver["error"]
    funcs.unlink()
    code, ver = invoke_json(["verify", "--db", str(db), out["run_id"]])
    assert code == 2 and "is missing" in ver["error"]


@pytest.mark.parametrize("args, message", [
    (["--task-type", "4", "--task-type", "6"], "task types 4, 6 read lab data"),
    (["--sim-tool", "x=0.5"], "--sim-tool"),
    (["--fhir-base", "http://localhost:8080/fhir/"], "either --patients"),
])
def test_bad_medagentbench_options_exit_2(tasks, tmp_path, args, message):
    code, out = run_fhir(tasks, tmp_path / "bad.duckdb", *args)
    assert code == 2 and message in out["error"], out


def test_bad_files_exit_2_naming_the_problem(tasks, tmp_path):
    code, out = invoke_json(["run", str(tasks), "--db", str(tmp_path / "b.duckdb")])
    assert code == 2 and "--env medagentbench" in out["error"]  # a task file without --env
    code, out = invoke_json(["run", str(tasks), "--funcs", str(FUNCS), "--db", str(tmp_path / "b.duckdb")])
    assert code == 2 and "only with --env medagentbench" in out["error"]
    code, out = invoke_json(["run", str(tasks), "--env", "medagentbench", "--patients", str(PATIENTS)])
    assert code == 2 and "needs --funcs" in out["error"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": "task1_1", "instruction": "x"}, {"id": "nope", "instruction": "y"}]))
    code, out = run_fhir(bad, tmp_path / "b.duckdb")
    assert code == 2 and str(bad) in out["error"] and "task #2" in out["error"] and "nope" in out["error"]
    code, out = run_fhir(tasks, tmp_path / "b.duckdb", funcs=tmp_path / "missing.json")
    assert code == 2 and "missing.json" in out["error"] and "not found" in out["error"]


# --- a model: the FHIR ReAct loop through the gateway, reflection by the model, then the record backend ---


def test_openai_backbone_acts_and_reflects_and_the_record_backend_reserves_it(tmp_path):
    db = tmp_path / "model.duckdb"
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    with FhirFake() as server:
        code, out = run_fhir(TASKS, db, "--protocol", "react", "--backbone", "openai", "--model", "fake-fhir", "--base-url", server.base_url,
                         "--task-type", "1", "--limit", "2", "--run-id", "m1", "--policy", ungated_policy(tmp_path), env=env)
    assert code == 0, out
    assert out["backbone"] == "openai" and out["correct"] == 2 and out["memory"]["rules"] == 1
    assert out["llm"]["calls"] == 6  # per task: the lookup, FINISH, the reflection
    assert out["metrics"]["q_sr"] == 100.0 and out["metrics"]["a_sr"] is None
    acts = [r["messages"] for r in server.requests if r["messages"][0]["content"].startswith("You are an expert")]
    assert "## Memory" not in acts[0][1]["content"]  # nothing learnt before the first task
    second = acts[2][1]["content"]  # the second task's first turn shows the rule reflection wrote
    assert "## Memory" in second and "MRN lookups: GET Patient" in second and "option letter" not in second
    assert "S6534835" not in acts[0][1]["content"]  # the gold `sol` is never shown
    with EventStore(str(db), read_only=True) as s:
        events = s.read("m1")
        types = [e.type for e in events]
    assert types.count("llm.exchange") == 6 and "rule.added" in types
    # the react loop's turns are schema-decoded where the server enforces json_schema (the default, auto)
    assert events[0].payload["actions"] == {"json_schema": "enforced", "mode": "schema"}
    assert all(r["response_format"]["json_schema"]["name"] == "FhirTurn" for r in server.requests
               if r["messages"][0]["content"].startswith("You are an expert"))
    assert {e.payload["source"] for e in events if e.type == "answer.given"} == {"llm:schema"}

    code, rec = run_fhir(TASKS, db, "--protocol", "react", "--backbone", "record", "--record-from", "m1", "--task-type", "1", "--limit", "2",
                     "--policy", ungated_policy(tmp_path), env=env)
    assert code == 0, rec
    assert rec["run_id"] == "m1-record" and rec["fingerprint"] == out["fingerprint"] and rec["correct"] == 2
