"""SkeMex, SELSM and RetroSum on MedAgentBench FHIR tasks (`grandrounds run --env medagentbench`): each writes
its memory from a FHIR trajectory (entity-agnostic: the template's terms and the calls by resource type and
parameter names), a later task of the same template retrieves what an earlier one wrote, and the run
re-executes byte-identically. With a model, SELSM's per-step guidance reaches the FHIR agent's prompt."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import MAB_TASKS as TASKS, needs_medagentbench
from fake_openai_server import FakeOpenAI
from fhir_helpers import invoke_json, offline_tasks_file, patient_lookup_turn, run_fhir
from llm_helpers import SECRET
from grandrounds.store.eventstore import EventStore

pytestmark = needs_medagentbench

MRN_OR_HOST = re.compile(r"\bS\d{7}\b|localhost|127\.0\.0\.1|https?://")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return offline_tasks_file(tmp_path_factory.mktemp("mab"))


# SkeMex's paper window (30) and buffer gating (a one-call success is "simple") would write nothing on 8
# tasks: a window of one and no gating make every task's skill available to the next.
POLICY_FILES = {"skemex": 'name = "skemex"\nwindow = 1\nbuffer_gating = false\n', "selsm": None, "retrosum": None}
WRITES = {"skemex": "skill.drafted", "selsm": "selsm.record.stored", "retrosum": "experience.stored"}


def _policy_arg(name: str, tmp_path: Path) -> str:
    if POLICY_FILES[name] is None:
        return name
    path = tmp_path / f"{name}.toml"
    path.write_text(POLICY_FILES[name])
    return str(path)


def _sources(events) -> dict[str, str]:
    """Memory item id -> the case it was derived from, as the policy's write events say."""
    out: dict[str, str] = {}
    for e in events:
        p = e.payload
        if e.type == "skill.reviewed" and p["accepted"]:
            out[p["skill_id"]] = p["source_case_id"]
        elif e.type == "selsm.record.stored":
            out.update({t["skill_id"]: p["source_case_id"] for t in p["transitions"]})
        elif e.type == "experience.stored":
            n = len(p["actor_lessons"])
            out.update({f"{p['experience_id']}-a{i}": p["source_case_id"] for i in range(1, n + 1)})
    return out


def _retrieved(events) -> dict[str, list[str]]:
    """Case -> ids of the items it was shown: case-level (`memory.retrieved`) and per-step (`memory` steps)."""
    out: dict[str, list[str]] = {}
    for e in events:
        if e.type == "memory.retrieved":
            out.setdefault(e.case_id, []).extend(i["item_id"] for i in e.payload.get("items", []))
        elif e.type == "answer.given":
            for s in e.payload["steps"]:
                if s["kind"] == "memory" and s["content"]:
                    out.setdefault(e.case_id, []).extend(s["content"].split(","))
    return out


@pytest.mark.parametrize("policy", ["skemex", "selsm", "retrosum"])
def test_policy_learns_from_fhir_tasks_and_verifies_identical(policy, tasks, tmp_path):
    db = tmp_path / f"{policy}.duckdb"
    code, out = run_fhir(tasks, db, "--policy", _policy_arg(policy, tmp_path))
    assert code == 0, out
    assert out["policy"] == policy and out["cases"] == 8 and out["correct"] == 8
    with EventStore(str(db), read_only=True) as s:
        events = s.read(out["run_id"])
    order = [e.case_id for e in events if e.type == "case.received"]
    written = [e for e in events if e.type == WRITES[policy]]
    assert len(written) >= 4  # at least one per task template
    assert not [e for e in events if e.type == "selsm.skill.rejected"]  # entity-agnostic by construction
    sources = _sources(events)
    texts = json.dumps([e.payload.get("body") or e.payload.get("actor_lessons") or
                        [t["skill"] for t in e.payload.get("transitions", [])] for e in written])
    assert "GET Patient?" in texts and "POST Observation" in texts and "FINISH" in texts
    assert not MRN_OR_HOST.search(texts)  # no MRN, no host in what was written

    # A later task retrieves an item derived from an earlier task of its template, never from itself.
    shown = _retrieved(events)
    for case_id, ids in shown.items():
        assert all(order.index(sources[i]) < order.index(case_id) for i in ids), (case_id, ids)
    for later, earlier in (("mab-task2_2", "mab-task2_1"), ("mab-task3_2", "mab-task3_1"),
                           ("mab-task8_2", "mab-task8_1")):
        assert earlier in {sources[i] for i in shown.get(later, [])}, (later, shown.get(later))

    code, ver = invoke_json(["verify", "--db", str(db), out["run_id"]])
    assert code == 0 and ver["identical"] and ver["replayed_fingerprint"] == out["fingerprint"], ver


def test_skemex_skill_from_a_fhir_task_names_the_action_pattern_and_tool(tasks, tmp_path):
    db = tmp_path / "sk.duckdb"
    # Without the k-subjects gate (it has its own tests in test_privacy_freetext.py): this checks how a skill
    # names its action pattern, which the gate would blank ('[...]') while too few patients hold its words.
    policy = tmp_path / "skemex-ungated.toml"
    policy.write_text(POLICY_FILES["skemex"] + "memory_min_subjects = 1\n")
    code, out = run_fhir(tasks, db, "--policy", str(policy), "--task-type", "2")
    assert code == 0, out
    with EventStore(str(db), read_only=True) as s:
        events = s.read(out["run_id"])
    drafted = next(e.payload for e in events if e.type == "skill.drafted")
    assert drafted["branch"] == "task" and drafted["body"]["required_tools"] == ["get_patient"]
    assert drafted["body"]["core_action"] == ("For FHIR tasks like 'age mrn': GET Patient?identifier=…, then FINISH "
                                              "with a one-value list; the official grader accepted this pattern.")
    assessed = next(e.payload for e in events if e.type == "skill.trajectory_assessed")
    assert assessed["decision"] == "CREATE"


# --- a model: SELSM's per-step guidance in the FHIR ReAct loop ---------------------------------------------


JUDGE_SKILL = {"label": "+", "category": "API Protocol", "task_scenario": "An MRN lookup by name and birth date.",
               "generalized_logic": "Search the Patient resource with the given, family and birthdate parameters "
                                    "taken from the instruction.",
               "canonical_example": "GET Patient with given, family and birthdate; FINISH with the id found.",
               "error_avoidance": "Do not guess an identifier.", "trigger": ["mrn", "name", "dob"]}


class SelsmFhirFake(FakeOpenAI):
    """Plays the FHIR agent on task-1 templates (look the patient up, FINISH with the id found) and SELSM's
    step judge (one success paradigm per round); keeps every request."""

    def _text(self, kind, messages, action):
        if messages[0]["content"].startswith("You are the step-level judge"):
            prompt = messages[1]["content"]
            assert "## FHIR task" in prompt and "graded correct by refsol:task1" in prompt
            rounds = [int(r) for r in re.findall(r"^### Round (\d+)$", prompt, re.MULTILINE)]
            return json.dumps({"steps": [{**JUDGE_SKILL, "round": r} for r in rounds]})
        return patient_lookup_turn(messages)


def test_selsm_per_step_guidance_reaches_the_fhir_agent_and_the_record_backend_reserves_it(tmp_path):
    db = tmp_path / "selsm-model.duckdb"
    policy = tmp_path / "selsm.toml"
    # One judged trajectory per task (no re-runs) and a state threshold the two tasks' states clear
    # (their queries differ in the patient's name and birth date).
    policy.write_text('name = "selsm"\ntrain_samples = 1\nstate_threshold = 0.3\n')
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    args = ["--policy", str(policy), "--task-type", "1", "--limit", "2"]
    with SelsmFhirFake() as server:
        code, out = run_fhir(TASKS, db, *args, "--protocol", "react", "--backbone", "openai", "--model", "fake-fhir",
                         "--base-url", server.base_url, "--run-id", "sf", env=env)
    assert code == 0, out
    assert out["correct"] == 2 and out["llm"]["calls"] == 6  # per task: lookup, FINISH, the judge
    acts = [r["messages"] for r in server.requests if r["messages"][0]["content"].startswith("You are an expert")]
    assert len(acts) == 4
    assert all("## Guidance for this step" not in a[1]["content"] for a in acts[:2])  # nothing learnt yet
    second = acts[2][1]["content"]  # the second task's first decision
    assert "## Guidance for this step" in second and "GET Patient with given, family and birthdate" in second
    assert "## Guidance for this step" in acts[3][1]["content"]  # retrieved again before the next decision
    with EventStore(str(db), read_only=True) as s:
        events = s.read("sf")
    stored = next(e.payload for e in events if e.type == "selsm.record.stored")
    assert stored["source_case_id"] == "mab-task1_1" and [t["round"] for t in stored["transitions"]] == [1, 2]
    answers = {e.case_id: e.payload for e in events if e.type == "answer.given"}
    memory_steps = [s["content"] for s in answers["mab-task1_2"]["steps"] if s["kind"] == "memory"]
    assert len(memory_steps) == 2 and all(c.startswith("rec-00000.0.") for c in memory_steps)
    assert [s["content"] for s in answers["mab-task1_1"]["steps"] if s["kind"] == "memory"] == ["", ""]

    code, rec = run_fhir(TASKS, db, *args, "--protocol", "react", "--backbone", "record", "--record-from", "sf", env=env)
    assert code == 0 and rec["fingerprint"] == out["fingerprint"], rec


class SelsmOfficialFake(SelsmFhirFake):
    """SELSM's step judge, and the agent in the official text protocol on task-1 templates."""

    def _text(self, kind, messages, action):
        if messages[0]["content"].startswith("You are the step-level judge"):
            return super()._text(kind, messages, action)
        prompt = messages[0]["content"]
        base = re.search(r"you should use (\S+) as the api_base", prompt).group(1)
        given, family, dob = re.search(r"name (\S+) (\S+) and DOB of (\d{4}-\d{2}-\d{2})", prompt).groups()
        found = [re.search(r'"id": "(S\d+)"', m["content"]) for m in messages[1:] if m["role"] == "user"]
        found = [f.group(1) for f in found if f]
        return (f'FINISH(["{found[0]}"])' if found else
                f"GET {base}Patient?given={given}&family={family}&birthdate={dob}")


def test_selsm_per_step_guidance_reaches_the_official_protocol_agent(tmp_path):
    """The official protocol (the default) shows SELSM's per-step guidance too: appended to the user message
    each round is sent with, never kept in the conversation; the ids are recorded, and the record backend
    re-serves the run."""
    db = tmp_path / "selsm-official.duckdb"
    policy = tmp_path / "selsm.toml"
    policy.write_text('name = "selsm"\ntrain_samples = 1\nstate_threshold = 0.3\n')
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    args = ["--policy", str(policy), "--task-type", "1", "--limit", "2"]
    with SelsmOfficialFake() as server:
        code, out = run_fhir(TASKS, db, *args, "--backbone", "openai", "--model", "fake-fhir",
                             "--base-url", server.base_url, "--run-id", "so", env=env)
    assert code == 0, out
    assert out["correct"] == 2 and out["llm"]["calls"] == 6  # per task: GET, FINISH, the judge
    acts = [r["messages"] for r in server.requests if "FINISH([answer1, answer2, ...])" in r["messages"][0]["content"]]
    assert len(acts) == 4
    assert all("## Guidance for this step" not in json.dumps(a) for a in acts[:2])  # nothing learnt yet
    first, second = acts[2], acts[3]  # the second task's two rounds
    assert len(first) == 1 and "## Guidance for this step" in first[0]["content"]
    assert first[0]["content"].index("Question: ") < first[0]["content"].index("## Guidance for this step")
    assert "GET Patient with given, family and birthdate" in first[0]["content"]
    assert len(second) == 3 and "## Guidance for this step" in second[2]["content"]  # after the GET's answer
    assert "## Guidance for this step" not in second[0]["content"]  # not kept in the conversation
    with EventStore(str(db), read_only=True) as s:
        events = s.read("so")
    answers = {e.case_id: e.payload for e in events if e.type == "answer.given"}
    memory_steps = [s["content"] for s in answers["mab-task1_2"]["steps"] if s["kind"] == "memory"]
    assert len(memory_steps) == 2 and all(c.startswith("rec-00000.0.") for c in memory_steps)
    assert answers["mab-task1_2"]["source"] == "llm:official"

    code, rec = run_fhir(TASKS, db, *args, "--backbone", "record", "--record-from", "so", env=env)
    assert code == 0 and rec["fingerprint"] == out["fingerprint"], rec
