"""AgentClinic OSCE cases through `grandrounds run --env agentclinic`: the five stages with memory,
recorded in the event log, graded by the judge (model) or the normalised string match (sim)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import AC_MEDQA
from fake_openai_server import FakeOpenAI
from grandrounds.cli import main
from llm_helpers import SECRET
from grandrounds.store.eventstore import EventStore

pytestmark = pytest.mark.skipif(not AC_MEDQA.exists(), reason=f"AgentClinic data not found at {AC_MEDQA}")

LINES = (1, 2, 3, 32, 88, 107)
"""Six MedQA OSCE cases: 1 and 107 are both myasthenia gravis, 32 and 88 both chronic lymphocytic leukemia."""


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    lines = AC_MEDQA.read_text(encoding="utf-8").splitlines()
    path = tmp_path_factory.mktemp("osce") / "agentclinic_medqa6.jsonl"
    path.write_text("".join(lines[n - 1] + "\n" for n in LINES), encoding="utf-8")
    return path


def _invoke(args: list[str], env: dict | None = None) -> tuple[int, dict]:
    r = CliRunner().invoke(main, [*args, "--json"], env=env or {})
    lines = r.stdout.strip().splitlines()
    assert lines, r.output
    return r.exit_code, json.loads(lines[-1])


def _run(cases: Path, db: Path, *extra: str, env: dict | None = None) -> tuple[int, dict]:
    return _invoke(["run", str(cases), "--env", "agentclinic", "--db", str(db), *extra], env)


@pytest.fixture(scope="module")
def sim_run(cases, tmp_path_factory):
    db = tmp_path_factory.mktemp("run") / "osce.duckdb"
    code, out = _run(cases, db)
    assert code == 0, out
    return db, out


def _events(db: Path, run_id: str):
    with EventStore(str(db), read_only=True) as s:
        return s.read(run_id)


def test_osce_cases_run_through_the_five_stages_and_are_recorded(sim_run):
    db, out = sim_run
    assert out["environment"] == "agentclinic" and out["cases"] == 6 and out["policy"] == "evo-medagent"
    assert "per_task_type" not in out
    events = _events(db, out["run_id"])
    assert events[0].meta["environment"]["name"] == "agentclinic"
    assert events[0].meta["environment"]["max_turns"] == 20
    by_case: dict[str, list[str]] = {}
    for e in events[1:]:
        if e.case_id is not None:  # run-level events (run.completed) belong to no case
            if e.type != "embeddings.recorded":  # recorded inputs between the stages' events
                by_case.setdefault(e.case_id, []).append(e.type)
    assert len(by_case) == 6 and events[-1].type == "run.completed"
    for types in by_case.values():
        assert types[:4] == ["case.received", "memory.retrieved", "answer.given", "feedback.recorded"]
        assert types[-1] == "case.completed"
    received = [e.payload["case"] for e in events if e.type == "case.received"]
    assert all(c["kind"] == "osce" and c["correct_diagnosis"] for c in received)  # the whole case
    answers = [e.payload for e in events if e.type == "answer.given"]
    feedback = [e.payload for e in events if e.type == "feedback.recorded"]
    for a, f, c in zip(answers, feedback, received):
        kinds = [s["kind"] for s in a["steps"]]
        assert kinds[-1] == "response" and a["steps"][-1]["content"].endswith(a["answer"])
        assert "DIAGNOSIS READY" in a["steps"][-1]["content"]
        tests = [s["content"] for s in a["steps"] if s["kind"] == "tool" and s["content"].startswith("REQUEST TEST")]
        assert tests and kinds.count("tool") == kinds.count("observation")  # every turn got its reply
        assert any(s["content"].startswith("Measurement: RESULTS") for s in a["steps"])
        assert f["answer"] == a["answer"] and f["gold"] == c["correct_diagnosis"]
    assert sum(f["correct"] for f in feedback) == out["correct"]


def test_accuracy_equals_grandrounds_agentclinic_without_memory(cases, tmp_path):
    code, plain = _invoke(["agentclinic", str(cases)])
    assert code == 0, plain
    code, out = _run(cases, tmp_path / "none.duckdb", "--policy", "none")
    assert code == 0, out
    assert out["correct"] == plain["correct"] and out["cases"] == plain["cases"]
    events = _events(tmp_path / "none.duckdb", out["run_id"])
    answers = [e.payload["answer"] for e in events if e.type == "answer.given"]
    assert answers == [r["diagnosis"] for r in plain["results"]]  # the same dialogues, the same diagnoses


def test_a_later_case_follows_a_rule_an_earlier_case_with_its_diagnosis_wrote(sim_run):
    db, out = sim_run
    events = _events(db, out["run_id"])
    created = {e.payload["rule_id"]: e.case_id for e in events if e.type == "rule.added"}
    assert created and out["memory"]["rules"] >= 1 and out["memory"]["episodes"] == 6
    received = {e.case_id: e.payload["case"]["correct_diagnosis"] for e in events if e.type == "case.received"}
    followed = [(e.case_id, e.payload["source"]) for e in events if e.type == "answer.given"
                and e.payload["source"].startswith("rule:")]
    assert followed
    # the last myasthenia case (line 107) adopts the rule the first (line 1) left, and is right
    last = next(e for e in events if e.type == "answer.given" and e.case_id.endswith("-006"))
    rule_id = last.payload["source"].removeprefix("rule:")
    assert created[rule_id].endswith("-001") and received[created[rule_id]] == received[last.case_id]
    assert last.payload["answer"] == "Myasthenia gravis"
    retrieved = next(e for e in events if e.type == "memory.retrieved" and e.case_id == last.case_id)
    assert rule_id in [r["rule_id"] for r in retrieved.payload["rules"]]
    assert "favour 'Myasthenia gravis'" in retrieved.payload["prefix"]


def test_same_inputs_same_fingerprint_and_verify_identical(cases, sim_run, tmp_path):
    db, out = sim_run
    code, again = _run(cases, tmp_path / "again.duckdb")
    assert code == 0 and again["fingerprint"] == out["fingerprint"] and again["run_id"] == out["run_id"]
    code, v = _invoke(["verify", "--db", str(db), out["run_id"]])
    assert code == 0 and v["identical"] and v["fingerprint"] == out["fingerprint"], v
    code, other = _run(cases, tmp_path / "turns.duckdb", "--max-turns", "4")
    assert code == 0 and other["run_id"] != out["run_id"]  # another turn budget is another run


def test_verify_refuses_when_the_case_file_changed(cases, tmp_path):
    moved = tmp_path / "agentclinic_medqa6.jsonl"
    moved.write_text(cases.read_text(encoding="utf-8"), encoding="utf-8")
    db = tmp_path / "v.duckdb"
    code, out = _run(moved, db, "--limit", "2")
    assert code == 0, out
    moved.write_text(moved.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    code, v = _invoke(["verify", "--db", str(db), out["run_id"]])
    assert code == 2 and "AgentClinic environment" in v["error"] and "sha256" in v["error"]


@pytest.mark.parametrize("args, needle", [
    (["--policy", "skemex"], "does not handle AgentClinic OSCE cases"),
    (["--sim-tool", "x=0.9"], "--sim-tool"),
    (["--funcs", "f.json"], "--funcs: only with --env medagentbench"),
    (["--broker", "kafka://localhost:9"], "embedded runner only"),
])
def test_bad_options_exit_2(cases, tmp_path, args, needle):
    code, out = _run(cases, tmp_path / "bad.duckdb", *args)
    assert code == 2 and needle in out["error"], out


def test_max_turns_without_agentclinic_is_refused(tmp_path):
    from conftest import EXAMPLES

    code, out = _invoke(["run", str(EXAMPLES), "--db", str(tmp_path / "x.duckdb"), "--max-turns", "3"])
    assert code == 2 and "--max-turns" in out["error"]


# --- openai (fake server) and record ---------------------------------------------------------


class OsceFake(FakeOpenAI):
    """Plays the doctor (question, test, diagnosis), the patient, the judge and the reflection model."""

    DOCTOR = ["What brings you in today?", "REQUEST TEST: Blood tests", "DIAGNOSIS READY: Myasthenia gravis"]

    def _text(self, kind, messages, action):
        system = messages[0]["content"]
        if system.startswith("You are a doctor"):
            turn = sum(m["role"] == "assistant" for m in messages)
            return self.DOCTOR[min(turn, len(self.DOCTOR) - 1)]
        if system.startswith("You are a patient"):
            return "Patient: It started a month ago and gets worse when I climb stairs."
        if system.startswith("You are responsible"):
            return "Yes"  # AgentClinic's moderator answers Yes or No
        if system.startswith("You maintain the procedural memory of a doctor agent"):
            assert "correct diagnosis:" in messages[1]["content"]
            return json.dumps({"summary": "diagnosed from the dialogue", "guideline": "ask about fatigability",
                               "edits": [{"op": "add", "text": "If the presentation includes double, vision: "
                                                               "favour 'Myasthenia gravis'.",
                                          "trigger": ["double", "vision"], "priority": 1, "reason": "seen"}]})
        raise AssertionError(f"unexpected prompt {system[:60]!r}")


def test_openai_path_records_doctor_patient_judge_and_reflection(cases, tmp_path):
    db = tmp_path / "model.duckdb"
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    with OsceFake() as server:
        code, live = _run(cases, db, "--limit", "2", "--backbone", "openai", "--model", "fake-doc",
                          "--base-url", server.base_url, "--run-id", "live", env=env)
        requests = list(server.requests)
    assert code == 0, live
    events = _events(db, "live")
    stages = sorted({e.payload["stage"] for e in events if e.type == "llm.exchange"})
    assert stages == ["act", "judge", "patient", "reflect"], stages
    doctor = [r for r in requests if r["messages"][0]["content"].startswith("You are a doctor")]
    assert "## Memory from earlier cases" in doctor[-1]["messages"][0]["content"]  # 2nd case sees the rule
    answers = [e.payload for e in events if e.type == "answer.given"]
    assert [a["answer"] for a in answers] == ["Myasthenia gravis"] * 2
    assert live["correct"] == 2  # the judge's verdict
    actors = json.dumps([r["messages"] for r in requests if r["messages"][0]["content"].startswith("You are a")])
    assert "Progressive multifocal" not in actors  # the second case's diagnosis reaches only judge / reflection

    code, rec = _run(cases, db, "--limit", "2", "--backbone", "record", "--record-from", "live", "--model",
                     "fake-doc", env=env)
    assert code == 0, rec
    assert rec["correct"] == live["correct"]
    replayed = [e.payload for e in _events(db, rec["run_id"]) if e.type == "answer.given"]
    assert replayed == answers


class ModeratorFake(FakeOpenAI):
    """A separate moderator model's server: answers AgentClinic's Yes/No question, and nothing else."""

    def _text(self, kind, messages, action):
        assert messages[0]["content"].startswith("You are responsible"), messages[0]["content"][:60]
        return "No"


def test_a_separate_judge_model_grades_and_is_recorded_and_verified(cases, tmp_path):
    """`--judge-model` (+ `--judge-base-url`): AgentClinic's moderator_llm is a model of its own. Its verdict
    decides `correct` (the doctor's server would say Yes, the moderator says No), its exchanges are recorded
    under stage judge with its model's name, and verify serves them from the record."""
    db = tmp_path / "judge.duckdb"
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    with OsceFake() as doctor, ModeratorFake() as moderator:
        code, out = _run(cases, db, "--limit", "2", "--backbone", "openai", "--model", "fake-doc",
                         "--base-url", doctor.base_url, "--judge-model", "fake-moderator", "--judge-base-url",
                         moderator.base_url, "--run-id", "judged", env=env)
        to_doctor, to_moderator = list(doctor.requests), list(moderator.requests)
    assert code == 0, out
    assert out["correct"] == 0  # the moderator's No, not the run's model's Yes
    assert not [r for r in to_doctor if r["messages"][0]["content"].startswith("You are responsible")]
    assert len(to_moderator) == 2 and {r["model"] for r in to_moderator} == {"fake-moderator"}
    events = _events(db, "judged")
    judged = [e.payload for e in events if e.type == "llm.exchange" and e.payload["stage"] == "judge"]
    assert [(j["model"], j["response"]) for j in judged] == [("fake-moderator", "No")] * 2
    started = events[0]
    assert started.meta["environment"]["judge_model"] == "fake-moderator"
    code, ver = _invoke(["verify", "--db", str(db), "judged"])
    assert code == 0 and ver["identical"], ver

    # Without --judge-base-url the moderator model is asked at the run's endpoint, under its own name.
    with OsceFake() as server:
        code, same = _run(cases, tmp_path / "same.duckdb", "--limit", "1", "--backbone", "openai", "--model",
                          "fake-doc", "--base-url", server.base_url, "--judge-model", "fake-moderator", env=env)
        asked = [r["model"] for r in server.requests if r["messages"][0]["content"].startswith("You are responsible")]
    assert code == 0 and asked == ["fake-moderator"], (same, asked)


@pytest.mark.parametrize("args, needle", [
    (["--judge-model", "m"], "--judge-model: the sim backbone"),
    (["--backbone", "openai", "--model", "x", "--base-url", "http://127.0.0.1:9", "--judge-base-url",
      "http://127.0.0.1:9"], "--judge-base-url needs --judge-model"),
])
def test_judge_options_that_cannot_apply_exit_2(cases, tmp_path, args, needle):
    code, out = _run(cases, tmp_path / "bad.duckdb", *args)
    assert code == 2 and needle in out["error"], out


def test_judge_model_without_agentclinic_is_refused(tmp_path):
    from conftest import EXAMPLES

    code, out = _invoke(["run", str(EXAMPLES), "--db", str(tmp_path / "x.duckdb"), "--judge-model", "m"])
    assert code == 2 and "--judge-model" in out["error"]


def test_doctor_turns_are_schema_decoded_where_the_server_enforces_it_and_text_on_request(cases, tmp_path):
    """`--actions auto` (default): one probe, then every doctor turn carries the DoctorTurn schema; the
    mode is in run.started, each turn's reasoning is a step, the answer's source is `model:schema`, and
    the run verifies from its record. `--actions text` keeps AgentClinic's text turns."""
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    db = tmp_path / "schema.duckdb"
    with OsceFake() as server:
        code, out = _run(cases, db, "--limit", "1", "--backbone", "openai", "--model", "fake-doc",
                         "--base-url", server.base_url, "--run-id", "s", env=env)
        doctor = [r for r in server.requests if r["messages"][0]["content"].startswith("You are a doctor")]
        judged = [r for r in server.requests if r["messages"][0]["content"].startswith("You are responsible")]
    assert code == 0, out
    assert doctor and all(r["response_format"]["json_schema"]["name"] == "DoctorTurn" for r in doctor)
    assert judged[0]["messages"][1]["content"].endswith("dialogue: DIAGNOSIS READY: Myasthenia gravis\nAre these the same?")
    events = _events(db, "s")
    assert events[0].payload["actions"] == {"json_schema": "enforced", "mode": "schema"}
    answer = next(e.payload for e in events if e.type == "answer.given")
    assert answer["source"] == "model:schema" and answer["answer"] == "Myasthenia gravis"
    kinds = [s["kind"] for s in answer["steps"]]
    assert kinds.count("reasoning") == len(doctor) and "REQUEST TEST: Blood tests" in [s["content"] for s in answer["steps"]]
    code, ver = _invoke(["verify", "--db", str(db), "s"])
    assert code == 0 and ver["identical"], ver
    with OsceFake() as server:  # resumed under auto: the recorded mode, no probe (the run is complete)
        code, again = _run(cases, db, "--limit", "1", "--backbone", "openai", "--model", "fake-doc",
                           "--base-url", server.base_url, "--run-id", "s", env=env)
        assert code == 0 and server.requests == [], (again, server.requests[:1])

    with OsceFake() as server:
        code, out = _run(cases, tmp_path / "text.duckdb", "--limit", "1", "--backbone", "openai", "--model",
                         "fake-doc", "--base-url", server.base_url, "--run-id", "t", "--actions", "text", env=env)
        doctor = [r for r in server.requests if r["messages"][0]["content"].startswith("You are a doctor")]
    assert code == 0, out
    assert doctor and all("response_format" not in r for r in doctor)
    events = _events(tmp_path / "text.duckdb", "t")
    answer = next(e.payload for e in events if e.type == "answer.given")
    assert answer["source"] == "model" and "reasoning" not in [s["kind"] for s in answer["steps"]]
