"""No error loses data: errors are classified once, at the edge (issue 43, part 1, for `grandrounds run`).

Before: an agent that raised `ValueError` (a `json.JSONDecodeError` from parsing a model's reply is one)
made `run` exit 2 "bad input" and delete the new database with the cases it had committed, leaving its
key file orphaned. Now an exception that escapes a case's stage is marked with the case, the stage and the
component (handlers/pipeline.py `mark_where`), and the boundary (grandrounds/errors.py) exits 1, keeps the
file with every committed case, names them, and says how to resume; exit 2 still means bad input found
before anything was written, and leaves nothing — and no exit deletes a file that holds a committed case.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli_helpers import cli_json, example_cases
from grandrounds.cli import main
from grandrounds.errors import discard_on_bad_input, fail
from grandrounds.store.dbfile import committed_cases

AGENT = '''
import json
CALLS = {"n": 0}

def answer(case, memory):
    CALLS["n"] += 1
    if CALLS["n"] == FAIL_AT:
        json.loads("{not json")  # what parsing a model's bad reply raises: a ValueError
    return sorted(case.options)[0]
'''


@pytest.fixture()
def agent_module(tmp_path, monkeypatch):
    def make(name: str, fail_at: int) -> str:
        (tmp_path / f"{name}.py").write_text(f"FAIL_AT = {fail_at}\n" + AGENT)
        sys.modules.pop(name, None)
        return f"{name}:answer"
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return make


def test_an_agent_raising_after_commits_keeps_every_committed_case(tmp_path, agent_module):
    cases = example_cases(tmp_path, 6)
    db = tmp_path / "new.duckdb"
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(db), "--run-id", "r", "--commit", "case",
                                    "--agent", agent_module("bad_agent", 4)])
    assert res.exit_code == 1, res.output
    assert "JSONDecodeError at case ex-004 (act stage" in res.output, res.output
    assert "3 committed case(s) kept" in res.output and "run the same command again to resume" in res.output
    assert db.exists() and Path(f"{db}.keys").exists() and committed_cases(db) == 3
    code, out = cli_json("verify", "--db", db, "r")
    assert out["chain_intact"] and out["completed_cases"] == 3 and out["reason"] == "incomplete", out
    # the same command with a mended agent resumes where it stopped, and the run is whole
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(db), "--run-id", "r", "--commit", "case",
                                    "--agent", agent_module("bad_agent", 0), "--json"])
    assert res.exit_code == 0, res.output
    code, out = cli_json("verify", "--db", db, "r")
    assert code == 0 and out["identical"] and out["completed_cases"] == 6, out


def test_an_agent_raising_at_the_first_case_exits_1_and_keeps_the_file(tmp_path, agent_module):
    cases = example_cases(tmp_path, 3)
    db = tmp_path / "first.duckdb"
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(db), "--run-id", "r", "--commit", "case",
                                    "--agent", agent_module("first_agent", 1)])
    assert res.exit_code == 1 and "at case ex-001" in res.output, res.output  # a case ran: not bad input


def test_bad_input_before_anything_is_written_still_exits_2_and_leaves_nothing(tmp_path):
    cases = example_cases(tmp_path, 3)
    db = tmp_path / "refused.duckdb"
    code, out = cli_json("run", cases, "--db", db, "--memory-from", "no-such-run")
    assert code == 2, out
    assert not db.exists() and not Path(f"{db}.keys").exists()


def test_no_exit_deletes_a_file_that_holds_a_committed_case(tmp_path):
    cases = example_cases(tmp_path, 2)
    db = tmp_path / "kept.duckdb"
    code, out = cli_json("run", cases, "--db", db, "--run-id", "r")
    assert code == 0 and committed_cases(db) == 2
    discard_on_bad_input(str(db))  # as if this command had created it
    with pytest.raises(SystemExit) as exit_:
        fail("something found late", 2, False)
    assert exit_.value.code == 1  # not 'bad input': the file holds committed cases, and it stays
    assert db.exists() and committed_cases(db) == 2
    code, out = cli_json("verify", "--db", db, "r")
    assert code == 0 and out["identical"], out
    assert json.loads(json.dumps(out))["cases"] == 2


def test_over_http_a_stage_that_raises_is_a_500_naming_the_case_and_keeps_the_namespace(tmp_path, monkeypatch):
    """A KeyError or a pydantic ValidationError escaping a stage used to read as the client's fault (404
    "namespace is not open", 422); it is the server's: 500, naming the case and stage, nothing of the case
    written, the earlier cases kept, and the same feedback succeeds once the cause is gone."""
    from starlette.testclient import TestClient

    from grandrounds.api import MemoryHub
    from grandrounds.handlers import pipeline
    from grandrounds.http_api import build_app

    real = pipeline.stage_def
    broken = {"on": False}

    class Broken:
        def __init__(self, stage):
            self.stage = stage

        async def run(self, *args):
            raise KeyError("a policy's missing key")

    def stage_def(stage):
        return Broken(stage) if broken["on"] and getattr(stage, "value", stage) == "reflect" else real(stage)

    monkeypatch.setattr(pipeline, "stage_def", stage_def)
    cases = [json.loads(line) for line in example_cases(tmp_path, 3).read_text().splitlines()]
    db = tmp_path / "http.duckdb"
    auth = {"Authorization": "Bearer s3cret"}
    with TestClient(build_app(MemoryHub(db), "s3cret")) as client:
        assert client.put("/v1/namespaces/w", json={"cases": 3}, headers=auth).status_code == 200
        for i, case in enumerate(cases):
            gold = case.pop("answer")
            assert client.post("/v1/namespaces/w/recall", json=case, headers=auth).status_code == 200
            assert client.post("/v1/namespaces/w/record", json={"case_id": case["case_id"], "answer": "A"},
                               headers=auth).status_code == 200
            broken["on"] = i == 1
            fb = client.post("/v1/namespaces/w/feedback", json={"case_id": case["case_id"], "outcome": gold},
                             headers=auth)
            if i == 1:
                assert fb.status_code == 500, fb.text
                assert f"KeyError at case {case['case_id']} (reflect stage" in fb.json()["error"], fb.text
                broken["on"] = False  # the cause mended: the same feedback goes through
                fb = client.post("/v1/namespaces/w/feedback", json={"case_id": case["case_id"], "outcome": gold},
                                 headers=auth)
            assert fb.status_code == 200, fb.text
        verified = client.post("/v1/namespaces/w/verify", headers=auth).json()
        assert verified["identical"] and verified["ok"] and verified["cases"] == 3, verified


def test_replay_names_the_case_a_stage_raised_at_and_keeps_the_file(tmp_path, monkeypatch):
    from grandrounds.handlers import pipeline

    cases = example_cases(tmp_path, 4)
    db = tmp_path / "replayed.duckdb"
    code, out = cli_json("run", cases, "--db", db, "--run-id", "r")
    assert code == 0, out
    real = pipeline.stage_def
    seen = {"n": 0}

    class Broken:
        async def run(self, *args):
            raise ValueError("a policy's bad value")  # a ValueError: once read as bad input, exit 2

    def stage_def(stage):
        if getattr(stage, "value", stage) == "reflect":
            seen["n"] += 1
            if seen["n"] == 3:
                return Broken()
        return real(stage)

    monkeypatch.setattr(pipeline, "stage_def", stage_def)
    res = CliRunner().invoke(main, ["replay", "--db", str(db), "--from", "r", "--permutations", "1",
                                    "--workers", "1"])
    assert res.exit_code == 1, res.output
    assert "ValueError at case" in res.output and "(reflect stage" in res.output, res.output
    monkeypatch.setattr(pipeline, "stage_def", real)
    code, out = cli_json("verify", "--db", db, "r")
    assert code == 0 and out["identical"], out  # the run replayed from is untouched


def test_over_mcp_a_stage_that_raises_is_a_tool_error_naming_the_case(tmp_path, monkeypatch):
    import asyncio

    from grandrounds.api import MemoryHub, NamespaceConfig
    from grandrounds.handlers import pipeline
    from grandrounds.mcp_server import build_server

    real = pipeline.stage_def
    broken = {"on": True}

    class Broken:
        async def run(self, *args):
            raise KeyError("a policy's missing key")

    monkeypatch.setattr(pipeline, "stage_def", lambda stage: Broken() if broken["on"] and getattr(
        stage, "value", stage) == "govern" else real(stage))
    case = json.loads(example_cases(tmp_path, 1).read_text().splitlines()[0])
    gold = case.pop("answer")

    async def drive():
        hub = MemoryHub(tmp_path / "mcp.duckdb")
        server = build_server(hub, "w", NamespaceConfig(cases=1))
        try:
            await server.call_tool("recall", {"case": case})
            await server.call_tool("record", {"case_id": case["case_id"], "answer": "A"})
            with pytest.raises(Exception) as failed:
                await server.call_tool("feedback", {"case_id": case["case_id"], "outcome": gold})
            broken["on"] = False
            await server.call_tool("feedback", {"case_id": case["case_id"], "outcome": gold})  # still open: goes
            return str(failed.value)
        finally:
            await hub.aclose()

    message = asyncio.run(drive())
    assert f"KeyError at case {case['case_id']} (govern stage" in message and "still open" in message, message


# --- the injection matrix: each error class at each stage of `grandrounds run` ------------------------------

def _injected():
    from grandrounds.handlers.llm.errors import ModelOutage
    from grandrounds.store.errors import Bug, InvalidInput
    from grandrounds.store.recorder import StoreError

    class FoundLate(InvalidInput, ValueError):
        """Bad input only found while a case ran (after the first commit): never exit 2."""

    return {
        "bad-input": lambda: FoundLate("a value found bad mid-case"),
        "agent": lambda: json.JSONDecodeError("Expecting value", "{not json", 1),
        "outage": lambda: ModelOutage("refused", "connection refused", "http://127.0.0.1:9/v1", 3,
                                      case_id="ex-003", stage="act"),
        "store": lambda: StoreError("the disk is full"),
        "bug": lambda: Bug("the agent loop's steps and tool calls do not pair up"),
    }


INJECTED = ["bad-input", "agent", "outage", "store", "bug"]


@pytest.mark.parametrize("kind", INJECTED)
@pytest.mark.parametrize("stage", ["retrieve", "act", "feedback", "reflect", "govern"])
def test_each_error_at_each_stage_keeps_every_committed_case(tmp_path, monkeypatch, stage, kind):
    from grandrounds.handlers import pipeline

    real = pipeline.stage_def
    calls = {"n": 0}
    make = _injected()[kind]

    class Raising:
        async def run(self, *args):
            raise make()

    def stage_def(s):
        if getattr(s, "value", s) == stage:
            calls["n"] += 1
            if calls["n"] == 3:  # the third case's stage: two cases are committed by then
                return Raising()
        return real(s)

    monkeypatch.setattr(pipeline, "stage_def", stage_def)
    cases = example_cases(tmp_path, 4)
    db = tmp_path / "m.duckdb"
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(db), "--run-id", "r", "--commit", "case"])
    monkeypatch.setattr(pipeline, "stage_def", real)
    assert res.exit_code == 1, res.output  # after the first commit: never 'bad input'
    assert "ex-003" in res.output and ("run the same command again" in res.output.lower()), res.output
    assert db.exists() and Path(f"{db}.keys").exists() and committed_cases(db) == 2
    code, out = cli_json("verify", "--db", db, "r")
    assert out["chain_intact"] and out["completed_cases"] == 2 and out["reason"] == "incomplete", out


def test_a_store_error_outside_any_case_exits_by_its_class(tmp_path, monkeypatch):
    """Not raised inside a stage (no mark) and not bad input: the exit its class stands for (1), no traceback."""
    import grandrounds.app
    from grandrounds.store.recorder import StoreError

    def refuse(*args, **kwargs):
        raise StoreError("the database refused the append")

    monkeypatch.setattr(grandrounds.app, "run_cases", refuse)
    res = CliRunner().invoke(main, ["run", str(example_cases(tmp_path, 2)), "--db", str(tmp_path / "s.duckdb")])
    assert res.exit_code == 1 and "the database refused the append" in res.output, res.output
    assert not isinstance(res.exception, NameError), res.exception
