"""`grandrounds run --env medagentbench` speaks the official MedAgentBench protocol by default: the
official prompt with the run's memory before it, GET/POST/FINISH replies, 8 rounds; graded from the
recorded conversation as refsol reads it; re-executed identically from its record; typed endings."""

from __future__ import annotations

import json
import re

from conftest import MAB_TASKS as TASKS, needs_medagentbench
from fhir_helpers import FhirFake, run_fhir, ungated_policy
from grandrounds.store.eventstore import EventStore
from llm_helpers import SECRET

pytestmark = needs_medagentbench
ENV = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}


class OfficialFake(FhirFake):
    """Plays the agent in the official text protocol for task-1 templates; `prose` puts a sentence
    before every action (officially an invalid action)."""

    prose = False

    def _text(self, kind, messages, action):
        if kind == "reflect":
            return super()._text(kind, messages, action)
        prompt = messages[0]["content"]
        base = re.search(r"you should use (\S+) as the api_base", prompt).group(1)
        name, dob = re.search(r"name (\S+ \S+) and DOB of (\d{4}-\d{2}-\d{2})", prompt).groups()
        found = [re.search(r'"id": "(S\d+)"', m["content"]) for m in messages[1:] if m["role"] == "user"]
        found = [f.group(1) for f in found if f]
        given, family = name.split()
        reply = (f'FINISH(["{found[0]}"])' if found else
                 f"GET {base}Patient?given={given}&family={family}&birthdate={dob}")
        return ("I will now act.\n" + reply) if self.prose else reply


def test_official_protocol_with_memory_records_and_replays(tmp_path):
    db = tmp_path / "official.duckdb"
    with OfficialFake() as server:
        code, out = run_fhir(TASKS, db, "--backbone", "openai", "--model", "fake", "--base-url", server.base_url,
                             "--task-type", "1", "--limit", "2", "--run-id", "o1", "--policy", ungated_policy(tmp_path),
                             env=ENV)
    assert code == 0, out
    assert out["correct"] == 2 and out["memory"]["rules"] == 1 and out["llm"]["calls"] == 6
    acts = [r["messages"] for r in server.requests if "FINISH([answer1, answer2, ...])" in r["messages"][0]["content"]]
    assert len(acts[0]) == 1 and acts[0][0]["content"].startswith("You are an expert in using FHIR functions")
    second = acts[2][0]["content"]  # the second task's prompt: the rule reflection wrote, then the official prompt
    assert second.startswith("## Memory from earlier tasks") and "MRN lookups: GET Patient" in second
    assert "You are an expert in using FHIR functions" in second and "option letter" not in second
    with EventStore(str(db), read_only=True) as s:
        events = s.read("o1")
    answer = next(e.payload for e in events if e.type == "answer.given")
    assert answer["source"] == "llm:official" and answer["answer"] == '["S6534835"]'
    assert [s["kind"] for s in answer["steps"]] == ["reasoning", "tool", "observation", "reasoning", "response"]
    assert answer["steps"][0]["content"].startswith("GET http://localhost:8080/fhir/Patient?")
    fb = next(e.payload for e in events if e.type == "feedback.recorded")
    assert fb["correct"] and fb["min_rounds"] == 2
    assert out["metrics"]["osr"] == 100.0  # both solved in refsol's two rounds

    code, rec = run_fhir(TASKS, db, "--backbone", "record", "--record-from", "o1", "--task-type", "1", "--limit", "2",
                         "--policy", ungated_policy(tmp_path), env=ENV)
    assert code == 0, rec
    assert rec["fingerprint"] == out["fingerprint"] and rec["correct"] == 2


def test_prose_before_the_action_is_an_invalid_action(tmp_path):
    with OfficialFake() as server:
        server.prose = True
        code, out = run_fhir(TASKS, tmp_path / "p.duckdb", "--backbone", "openai", "--model", "fake", "--base-url",
                             server.base_url, "--task-type", "1", "--limit", "1", "--policy", "none", env=ENV)
    assert code == 0, out
    assert out["correct"] == 0 and out["metrics"]["r_inv"] == 1.0 and out["metrics"]["er"] == 0.0
    with EventStore(str(tmp_path / "p.duckdb"), read_only=True) as s:
        failed = next(e.payload for e in s.read(out["run_id"]) if e.type == "case.failed")
    assert failed["termination"] == "invalid_action" and "invalid action at round 1" in failed["reason"]


def test_protocol_options_are_checked(tmp_path):
    code, out = run_fhir(TASKS, tmp_path / "x.duckdb", "--protocol", "react", "--max-rounds", "3")
    assert code == 2 and "--max-steps" in out["error"]
    from fhir_helpers import invoke_json

    code, out = invoke_json(["run", "examples/cases.jsonl", "--protocol", "official", "--db", str(tmp_path / "y.duckdb")])
    assert code == 2 and "only with --env medagentbench" in out["error"]
