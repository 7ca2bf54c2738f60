"""`benchmarks/bench_local_model.py` end to end against an OpenAI-compatible server: the fake server of the
tests (not the real model) plays every role the benchmark's runs ask for, so the whole harness — the fixed
slice (20 MedAgentBench tasks of types 1, 2, 3, 8 and 10 AgentClinic cases), `none` against each memory
policy, train then frozen, a separate AgentClinic judge, the report, `grandrounds verify` of every test run
— runs as it will against the real model. The fake's success rates mean nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import AC_MEDQA, ROOT, SHARED_DATA, needs_medagentbench
from fake_openai_server import FakeOpenAI
from grandrounds.store.eventstore import EventStore

pytestmark = [needs_medagentbench, pytest.mark.slow,
              pytest.mark.skipif(not AC_MEDQA.exists(), reason=f"AgentClinic data not found at {AC_MEDQA}")]

SCRIPT = ROOT / "benchmarks" / "bench_local_model.py"


def instance(schema: dict, root: dict):
    """A minimal value that validates against a pydantic JSON schema (what a model constrained by
    json_schema could return): required fields only, the first enum value, the shortest array."""
    if "$ref" in schema:
        return instance(root["$defs"][schema["$ref"].rsplit("/", 1)[-1]], root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = schema[key]
            return instance(next((o for o in options if o.get("type") == "null"), options[0]), root)
    kind = schema.get("type")
    if kind == "object":
        return {k: instance(v, root) for k, v in schema.get("properties", {}).items() if k in schema.get("required", ())}
    if kind == "array":
        return [instance(schema.get("items", {}), root) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        return "a general step" + "." * max(0, schema.get("minLength", 0) - 14)
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    return None


class BenchFake(FakeOpenAI):
    """Every role of the benchmark's runs: the MedAgentBench agent in the official protocol (task 1
    solved: look the patient up, FINISH with the id; other types: one GET, then an empty FINISH), the
    AgentClinic doctor, patient and (as the separate judge model) moderator, and every structured policy
    task (a minimal schema-valid reply)."""

    def answer(self, path, body, auth):
        with self._lock:
            self.requests.append(body)
        messages = body["messages"]
        rf = body.get("response_format") or {}
        if rf.get("type") == "json_schema":
            schema = rf["json_schema"]["schema"]
            return 200, self.completion(body, json.dumps(instance(schema, schema))), {}
        return 200, self.completion(body, self.reply(messages)), {}

    @staticmethod
    def reply(messages: list[dict]) -> str:
        first, system = messages[0]["content"], messages[0]["content"]
        if "FINISH([answer1, answer2, ...])" in first:  # official MedAgentBench protocol
            base = re.search(r"you should use (\S+) as the api_base", first).group(1)
            question = first.rsplit("Question: ", 1)[-1]
            found = [re.search(r'"id": "(S\d+)"', m["content"]) for m in messages[1:] if m["role"] == "user"]
            found = [f.group(1) for f in found if f]
            lookup = re.search(r"name (\S+) (\S+) and DOB of (\d{4}-\d{2}-\d{2})", question)
            if lookup:
                return (f'FINISH(["{found[0]}"])' if found else
                        f"GET {base}Patient?given={lookup[1]}&family={lookup[2]}&birthdate={lookup[3]}")
            if len(messages) > 1:
                return "FINISH([])"
            mrn = re.search(r"S\d{7}", question)
            return f"GET {base}Patient?identifier={mrn.group(0) if mrn else 'x'}"
        if system.startswith("You are a doctor"):
            turn = sum(m["role"] == "assistant" for m in messages)
            return ["What brings you in today?", "REQUEST TEST: Physical examination",
                    "DIAGNOSIS READY: Myasthenia gravis"][min(turn, 2)]
        if system.startswith("You are a patient"):
            return "It started a month ago and gets worse in the evening."
        if system.startswith("You are responsible"):  # AgentClinic's moderator question
            gold = re.search(r"correct diagnosis: (.*)\n", messages[1]["content"]).group(1)
            return "Yes" if "myasthenia" in gold.lower() else "No"
        schema = re.search(r"validate against this JSON schema: (\{.*\})\s*$", messages[-1]["content"], re.DOTALL)
        if schema:  # prompt-mode structured output
            s = json.loads(schema.group(1))
            return json.dumps(instance(s, s))
        return "Summary: the agent looked the record up and finished."


def test_the_local_model_benchmark_runs_its_whole_slice_against_an_openai_compatible_server(tmp_path):
    db, report = tmp_path / "bench.duckdb", tmp_path / "bench.json"
    with BenchFake() as server:
        r = subprocess.run([sys.executable, str(SCRIPT), "--base-url", server.base_url, "--model", "fake-agent",
                            "--judge-model", "fake-moderator", "--data", str(SHARED_DATA), "--db", str(db),
                            "--json", str(report), "--timeout", "60"],
                           capture_output=True, text=True, cwd=ROOT, env=_env())
        requests = list(server.requests)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(report.read_text())
    rows = {(x["benchmark"], x["policy"]): x for x in out["rows"]}
    assert set(rows) == {("medagentbench", p) for p in ("none", "evo-medagent", "skemex", "selsm", "retrosum")} | \
        {("agentclinic", p) for p in ("none", "evo-medagent")}
    assert not [x for x in out["rows"] if "error" in x]

    # The slice: 20 MedAgentBench tasks of types 1, 2, 3, 8 (5 each, 2 train + 3 test per type), 10 cases.
    slice_dir = Path(out["slice"])
    train = json.loads((slice_dir / "mab_train.json").read_text())
    test = json.loads((slice_dir / "mab_test.json").read_text())
    assert len(train) + len(test) == 20 and len(test) == 12
    assert sorted({t["id"].split("_")[0] for t in train + test}) == ["task1", "task2", "task3", "task8"]
    osce = [line for f in ("osce_train.jsonl", "osce_test.jsonl") for line in (slice_dir / f).read_text().splitlines()]
    assert len(osce) == 10
    assert rows[("medagentbench", "none")]["test_tasks"] == 12 and rows[("agentclinic", "none")]["test_tasks"] == 5

    # none: the test split only; every policy: train, then the test from the train run's memory, frozen.
    assert "train_run" not in rows[("medagentbench", "none")]
    with EventStore(str(db), read_only=True) as s:
        for (bench, policy), row in rows.items():
            assert row["verified"] is True, row  # re-executed identically from its record
            started = s.read(row["test_run"], upto_seq=0)[0].payload
            assert started["policy_name"] == policy
            if policy != "none":
                assert started["memory_from"]["run_id"] == row["train_run"] == f"{bench}-{policy}-train", started
            assert row["tokens_per_task"] > 0 and row["s_per_task"] is not None

    # The official protocol reached the model, and AgentClinic's moderator was the separate judge model.
    assert any("FINISH([answer1, answer2, ...])" in q["messages"][0]["content"] for q in requests)
    judged = [q["model"] for q in requests if q["messages"][0]["content"].startswith("You are responsible")]
    assert judged and set(judged) == {"fake-moderator"}
    assert "| medagentbench | selsm | 12 |" in r.stdout and "not a clinical claim" in r.stdout

    # Interrupted and run again: the finished runs are found complete, none is run twice.
    with BenchFake() as server:
        again = subprocess.run([sys.executable, str(SCRIPT), "--base-url", server.base_url, "--model", "fake-agent",
                                "--judge-model", "fake-moderator", "--data", str(SHARED_DATA), "--db", str(db),
                                "--policies", "none,evo-medagent", "--no-verify"],
                               capture_output=True, text=True, cwd=ROOT, env=_env())
        assert again.returncode == 0, again.stderr[-2000:]
        assert server.requests == []
    assert "resumed" in again.stdout


def _env() -> dict:
    import os

    return {**os.environ, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": ""}
