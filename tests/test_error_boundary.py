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
from hostile_rows import Hostile

T = "tests/test_error_boundary.py::"
STAGES = ["retrieve", "act", "feedback", "reflect", "govern"]
INJECTED = ["bad-input", "agent", "outage", "store", "bug"]
HOSTILE = {  # the rows of docs/trust.md's hostile matrix these tests assert
    "agent": Hostile(
        "an agent that raises `ValueError` (a `json.JSONDecodeError`) at the 4th case of `run --commit case`",
        T + "test_an_agent_raising_after_commits_keeps_every_committed_case",
        "exit 2 \"bad input\", the new database deleted, its key file orphaned",
        exit=1, says=("JSONDecodeError at case ex-004 (act stage", "3 committed case(s) kept",
                      "run the same command again to resume"), kept=3, codes=("incomplete",)),
    "resumed": Hostile("the same command again, the agent mended",
                       T + "test_an_agent_raising_after_commits_keeps_every_committed_case", "—", exit=0, codes=()),
    "matrix": Hostile(
        "each error class (" + ", ".join(INJECTED) + ") raised at each stage (" + ", ".join(STAGES)
        + ") of the 3rd case of `run --commit case`",
        T + "test_each_error_at_each_stage_keeps_every_committed_case",
        "exit 2 and the file deleted for a ValueError (bad input, an agent's JSONDecodeError)",
        exit=1, says=("ex-003", "run the same command again"), kept=2, codes=("incomplete",)),
    "before-writing": Hostile(
        "bad input found before anything is written (`run --memory-from` a run that is not there)",
        T + "test_bad_input_before_anything_is_written_still_exits_2_and_leaves_nothing", "the same",
        exit=2, written=False),
    "http": Hostile(
        "over HTTP, a stage raising `KeyError` at the 2nd case's `feedback` (then the same request again)",
        T + "test_over_http_a_stage_that_raises_is_a_500_naming_the_case_and_keeps_the_namespace",
        "404 \"namespace is not open\" (422 for a ValidationError)",
        status=500, says=("KeyError at case ex-002 (reflect stage",), codes=()),
    "replay": Hostile(
        "`replay` of a run, a stage raising `ValueError` at its 3rd case",
        T + "test_replay_names_the_case_a_stage_raised_at_and_keeps_the_file", "exit 2 \"bad input\"",
        exit=1, says=("ValueError at case", "(reflect stage"), codes=()),
    "mcp": Hostile(
        "over MCP, a stage raising `KeyError` in `feedback` (then the same call again)",
        T + "test_over_mcp_a_stage_that_raises_is_a_tool_error_naming_the_case", "—",
        raises="ToolError", says=("KeyError at case ex-001 (govern stage", "still open")),
}

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
    row = HOSTILE["agent"]
    assert res.exit_code == row.exit and row.said(res.output), res.output
    assert db.exists() and Path(f"{db}.keys").exists() and committed_cases(db) == row.kept
    code, out = cli_json("verify", "--db", db, "r")
    assert out["chain_intact"] and out["completed_cases"] == row.kept, out
    assert tuple(out["reason_codes"]) == row.codes, out
    # the same command with a mended agent resumes where it stopped, and the run is whole
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(db), "--run-id", "r", "--commit", "case",
                                    "--agent", agent_module("bad_agent", 0), "--json"])
    assert res.exit_code == HOSTILE["resumed"].exit, res.output
    code, out = cli_json("verify", "--db", db, "r")
    assert code == 0 and out["identical"] and out["completed_cases"] == 6, out
    assert tuple(out["reason_codes"]) == HOSTILE["resumed"].codes, out


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
    row = HOSTILE["before-writing"]
    assert code == row.exit, out
    assert row.written is False and not db.exists() and not Path(f"{db}.keys").exists()


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
                row = HOSTILE["http"]
                assert fb.status_code == row.status and row.said(fb.json()["error"]), fb.text
                assert case["case_id"] == "ex-002"
                broken["on"] = False  # the cause mended: the same feedback goes through
                fb = client.post("/v1/namespaces/w/feedback", json={"case_id": case["case_id"], "outcome": gold},
                                 headers=auth)
            assert fb.status_code == 200, fb.text
        verified = client.post("/v1/namespaces/w/verify", headers=auth).json()
        assert verified["identical"] and verified["ok"] and verified["cases"] == 3, verified
        assert tuple(verified["reason_codes"]) == HOSTILE["http"].codes, verified


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
    row = HOSTILE["replay"]
    assert res.exit_code == row.exit and row.said(res.output), res.output
    monkeypatch.setattr(pipeline, "stage_def", real)
    code, out = cli_json("verify", "--db", db, "r")
    assert code == 0 and out["identical"] and tuple(out["reason_codes"]) == row.codes, out  # untouched


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
            return failed.value
        finally:
            await hub.aclose()

    failed, row = asyncio.run(drive()), HOSTILE["mcp"]
    assert type(failed).__name__ == row.raises and row.said(str(failed)), repr(failed)
    assert case["case_id"] == "ex-001"


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


@pytest.mark.parametrize("kind", INJECTED)
@pytest.mark.parametrize("stage", STAGES)
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
    row = HOSTILE["matrix"]
    assert res.exit_code == row.exit, res.output  # after the first commit: never 'bad input'
    assert row.said(res.output.lower()), res.output
    assert db.exists() and Path(f"{db}.keys").exists() and committed_cases(db) == row.kept
    code, out = cli_json("verify", "--db", db, "r")
    assert out["chain_intact"] and out["completed_cases"] == row.kept, out
    assert tuple(out["reason_codes"]) == row.codes, out


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
