"""MedAgentBench with a model: the official text protocol (GET / POST / FINISH) through the gateway,
against the local sandbox, graded by refsol rules; exchanges recorded and re-served by `record`."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from conftest import MAB_FUNCS as FUNCS, MAB_PATIENTS as PATIENTS, MAB_TASKS as TASKS, needs_medagentbench
from fake_openai_server import FakeOpenAI
from grandrounds.cli import main
from grandrounds.handlers.environments.medagentbench import FhirTools, load_functions, parse_action
from llm_helpers import SECRET
from grandrounds.store.eventstore import EventStore

BP_PAYLOAD = {"resourceType": "Observation",
              "category": [{"coding": [{"system": "http://hl7.org/fhir/observation-category",
                                        "code": "vital-signs", "display": "Vital Signs"}]}],
              "code": {"text": "BP"}, "effectiveDateTime": "2023-11-13T10:15:00+00:00", "status": "final",
              "valueString": "118/77 mmHg", "subject": {"reference": "Patient/S2380121"}}

SCRIPTS = {
    # task1_1: find the MRN of Peter Stafford, DOB 1932-12-29
    "Peter Stafford": ["GET {base}Patient?given=Peter&family=Stafford&birthdate=1932-12-29",
                       'FINISH(["S6534835"])'],
    # task3_1: record the blood pressure 118/77 mmHg for S2380121
    "S2380121": ["POST {base}Observation\n" + json.dumps(BP_PAYLOAD), "FINISH([])"],
}


class MabFake(FakeOpenAI):
    """Plays the agent from SCRIPTS (by a phrase of the question), one reply per round."""

    def __init__(self, scripts=SCRIPTS):
        super().__init__()
        self.scripts = scripts

    def _text(self, kind, messages, action):
        prompt = messages[0]["content"]
        base = re.search(r"you should use (\S+) as the api_base", prompt).group(1)
        question = prompt.split("\nQuestion: ", 1)[1]
        rnd = sum(m["role"] == "assistant" for m in messages)
        for phrase, replies in self.scripts.items():
            if phrase in question:
                return replies[rnd].replace("{base}", base) if rnd < len(replies) else "I am done."
        return "I cannot help with that."


def _cli(args, env=None):
    r = CliRunner().invoke(main, ["medagentbench", str(TASKS), "--funcs", str(FUNCS), "--patients", str(PATIENTS),
                                  *args, "--json"], env=env or {})
    return r.exit_code, json.loads(r.stdout.strip().splitlines()[-1])


def test_parse_action_follows_the_official_harness():
    assert parse_action("Let me look.\nGET http://h/fhir/Patient?identifier=S1").kind == "invalid"  # prose first
    a = parse_action("GET http://h/fhir/Patient?identifier=S1")
    assert (a.kind, a.url) == ("get", "http://h/fhir/Patient?identifier=S1")
    a = parse_action('```tool_code\nPOST http://h/fhir/Observation\n{"resourceType": "Observation"}\n```')
    assert (a.kind, a.url, a.payload) == ("post", "http://h/fhir/Observation", {"resourceType": "Observation"})
    assert parse_action("POST http://h/fhir/Observation\n{oops").payload_error
    assert parse_action("POST http://h/fhir/Observation\n[1, 2]").payload == [1, 2]  # any JSON
    assert parse_action('FINISH(["S1", [1, (2)]])').result == '["S1", [1, (2)]]'
    assert parse_action('FINISH(["S1"]) trailing').result == '["S1"]) trailin'  # reply[len('FINISH('):-1]
    assert parse_action("The answer is S1").kind == "invalid"


@needs_medagentbench
async def test_urls_outside_the_fhir_base_are_not_fetched():
    tools = FhirTools(load_functions(FUNCS), "http://127.0.0.1:9/fhir/", public_base="http://localhost:8080/fhir")
    assert "only URLs under" in await tools.get_url("http://example.org/secret")
    assert "only URLs under http://localhost:8080/fhir/" in await tools.get_url("http://127.0.0.1:9/fhir/Patient")
    # a POST is never sent (as officially): any JSON payload is accepted, whatever the URL
    assert tools.post_url("http://localhost:8080/fhir/../admin", {"a": 1}).startswith("POST request accepted")
    assert [c.accepted for c in tools.trajectory.calls] == [False, False, True]


@needs_medagentbench
def test_openai_agent_solves_type1_and_type3_through_the_sandbox_and_record_replays(tmp_path):
    db = str(tmp_path / "mab.duckdb")
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    with MabFake() as server:
        code, out = _cli(["--backbone", "openai", "--model", "fake-fhir", "--base-url", server.base_url, "--db", db,
                          "--run-id", "t1", "--task-type", "1", "--limit", "1"], env)
        assert code == 0, out
        assert out["agent"] == "openai" and out["graded"] == 1 and out["correct"] == 1
        row = out["results"][0]
        assert row["case_id"] == "mab-task1_1" and row["status"] == "completed" and row["rounds"] == 2
        assert row["answer"] == '["S6534835"]' and row["calls"] == 1
        first = server.requests[0]["messages"]
        assert len(first) == 1 and "FINISH([answer1, answer2, ...])" in first[0]["content"]
        assert "S6534835" not in first[0]["content"]  # the gold `sol` is never shown
        assert "S6534835" in server.requests[1]["messages"][-1]["content"]  # the GET's bundle came back
        assert out["llm"]["calls"] == 2 and out["metrics"]["q_sr"] == 100.0 and out["metrics"]["a_sr"] is None

        code, out3 = _cli(["--backbone", "openai", "--model", "fake-fhir", "--base-url", server.base_url,
                           "--db", db, "--run-id", "t3", "--task-type", "3", "--limit", "1"], env)
        assert code == 0, out3
        assert out3["correct"] == 1 and out3["results"][0]["reason"] == "payload matches"
        assert out3["metrics"]["a_sr"] == 100.0

        code, both = _cli(["--backbone", "openai", "--model", "fake-fhir", "--base-url", server.base_url,
                           "--db", db, "--task-type", "1", "--task-type", "3", "--limit", "32"], env)
        assert code == 0 and both["correct"] == 2 and both["graded"] == 32  # only tasks 1_1 and 3_1 are scripted
        m = both["metrics"]  # 30 type-1 tasks (1 solved) and task3_1, task3_2 (1 solved)
        assert m["a_sr"] == 50.0 and m["q_sr"] == pytest.approx(100 / 30, abs=1e-5)
        assert m["qab"] == pytest.approx(1 - (50 - 100 / 30) / 50, abs=1e-5)
        assert m["er"] == pytest.approx(2 / 32, abs=1e-5)  # the unscripted tasks end on an invalid action
        assert {r["status"] for r in both["results"]} == {"completed", "invalid_action"}

    with EventStore(db) as s:
        fingerprint = s.fingerprint("t1")
    assert SECRET not in open(db, "rb").read().decode("latin-1")
    code, rec = _cli(["--backbone", "record", "--record-from", "t1", "--db", db, "--task-type", "1", "--limit", "1"],
                     env)
    assert code == 0, rec
    assert rec["correct"] == 1 and rec["llm"]["run_id"] == "t1-record" and rec["llm"]["fingerprint"] == fingerprint


@needs_medagentbench
def test_round_limit_and_bad_options(tmp_path):
    chatty = {"Peter Stafford": ["GET {base}Patient?family=Stafford"] * 5}
    with MabFake(chatty) as server:
        code, out = _cli(["--backbone", "openai", "--model", "m", "--base-url", server.base_url,
                          "--db", str(tmp_path / "l.duckdb"), "--task-type", "1", "--limit", "1", "--max-rounds", "3"],
                         {"OPENAI_API_KEY": SECRET})
    assert code == 0, out
    assert out["results"][0]["status"] == "limit_reached" and out["correct"] == 0 and out["metrics"]["er"] == 0.0
    assert len(server.requests) == 3
    code, out = _cli(["--backbone", "openai"])
    assert code == 2 and "--model" in out["error"]
