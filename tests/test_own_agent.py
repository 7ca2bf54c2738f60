"""Your own agent: the Python API, `run --agent`, the HTTP API and the MCP server give one kind of run.

The premise of every comparison: a 20-case session driven with the same scripted replies (a function of
what the agent is shown, tests/own_agent_script.py) must have the same event bytes and fingerprint
whichever way it was driven, verify, and replay."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from grandrounds import AgentReply, Memory
from grandrounds.cli import main
from grandrounds.store.canonical import sha256_hex
from grandrounds.store.eventstore import EventStore

sys.path.insert(0, str(Path(__file__).parent))
import own_agent_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NS = "ward-7"
N = 20


@pytest.fixture(scope="module")
def case_file(tmp_path_factory) -> Path:
    lines = (ROOT / "examples" / "cases.jsonl").read_text(encoding="utf-8").splitlines()[:N]
    path = tmp_path_factory.mktemp("cases") / "cases20.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def source_of(path: Path) -> str:
    return sha256_hex(path.read_text(encoding="utf-8"))  # what `grandrounds run` records as the run's source


def cases_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def log_of(db: Path, run_id: str = NS) -> tuple[list[tuple], str]:
    with EventStore(str(db), read_only=True) as store:
        rows = [(e.seq, e.type, json.dumps(e.payload, sort_keys=True)) for e in store.read(run_id)]
        return rows, store.fingerprint(run_id)


def drive_api(db: Path, case_file: Path) -> str:
    """The session through the Python API, the gold given only at feedback."""
    with Memory.open(db, namespace=NS, cases=N, source=source_of(case_file)) as memory:
        for case in cases_of(case_file):
            gold = case.pop("answer")
            shown = memory.recall(case)
            assert shown.index == cases_of(case_file).index(dict(case, answer=gold))
            reply = own_agent_script.scripted(case["options"], [i.model_dump() for i in shown.items])
            memory.record(case["case_id"], **reply)
            result = memory.feedback(case["case_id"], outcome=gold)
            assert result.gold == gold and result.correct == (reply["answer"] == gold)
        return memory.namespace


@pytest.fixture(scope="module")
def api_db(tmp_path_factory, case_file) -> Path:
    db = tmp_path_factory.mktemp("api") / "api.duckdb"
    drive_api(db, case_file)
    return db


@pytest.fixture(scope="module")
def run_db(tmp_path_factory, case_file) -> Path:
    db = tmp_path_factory.mktemp("run") / "run.duckdb"
    result = CliRunner().invoke(main, ["run", str(case_file), "--db", str(db), "--agent", "own_agent_script:agent",
                                       "--model", "agent", "--run-id", NS, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["backbone"] == "agent" and out["cases"] == N
    return db


def test_api_session_is_byte_identical_to_run_agent(api_db, run_db):
    api_rows, api_fp = log_of(api_db)
    run_rows, run_fp = log_of(run_db)
    assert len(api_rows) == len(run_rows) > 10 * N
    assert api_rows == run_rows
    assert api_fp == run_fp
    types = {t for _, t, _ in api_rows}
    assert {"llm.exchange", "answer.given", "rule.added", "run.completed"} <= types
    # the agent's replies are recorded as exchanges, with what it was shown as the request
    exchange = next(json.loads(p) for _, t, p in api_rows if t == "llm.exchange")
    assert exchange["model"] == "agent" and exchange["stage"] == "act"
    assert json.loads(exchange["messages"][1]["content"])["case"].get("answer") is None  # no gold shown


def test_both_verify_without_the_agent(api_db, run_db):
    for db in (api_db, run_db):
        result = CliRunner().invoke(main, ["verify", "--db", str(db), NS, "--json"])
        out = json.loads(result.output.strip().splitlines()[-1])
        assert result.exit_code == 0, result.output
        assert out["identical"] and out["ok"] and out["replayed_from_record"]


def test_both_replay_alike_and_a_permutation_needs_the_agent(api_db, run_db, monkeypatch):
    monkeypatch.chdir(Path(__file__).parent)
    prints = []
    for db in (api_db, run_db):
        refused = CliRunner().invoke(main, ["replay", "--db", str(db), "--from", NS, "--permutations", "1", "--json"])
        assert refused.exit_code == 1 and "--agent module:callable" in refused.output
        result = CliRunner().invoke(main, ["replay", "--db", str(db), "--from", NS, "--permutations", "2",
                                           "--agent", "own_agent_script:agent", "--json"])
        assert result.exit_code == 0, result.output
        out = json.loads(result.output.strip().splitlines()[-1])
        prints.append([r["fingerprint"] for r in out["runs"]])
        assert all(r["llm_calls"]["live"] > 0 for r in out["runs"])
    assert prints[0] == prints[1]
    assert len(set(prints[0])) == 2  # two orders, two memories


def test_api_replay_asks_the_agent_given_to_it(api_db, tmp_path):
    db = tmp_path / "copy.duckdb"
    db.write_bytes(api_db.read_bytes())
    (tmp_path / "copy.duckdb.keys").write_bytes(Path(str(api_db) + ".keys").read_bytes())
    with _reopen(db) as memory:
        out = memory.replay(orders=1, agent=own_agent_script.async_agent)
        assert out["runs"][0]["cases"] == N


def _reopen(db: Path) -> Memory:
    with EventStore(str(db), read_only=True) as store:
        from grandrounds.handlers.runs import read_spec

        spec = read_spec(store, NS)
    return Memory.open(db, namespace=NS, cases=N, source=spec.source)


def test_http_session_gives_the_same_fingerprint(api_db, case_file, tmp_path):
    from starlette.testclient import TestClient

    from grandrounds.api import MemoryHub
    from grandrounds.http_api import build_app

    db = tmp_path / "http.duckdb"
    auth = {"Authorization": "Bearer s3cret"}
    with TestClient(build_app(MemoryHub(db), "s3cret")) as client:
        r = client.put(f"/v1/namespaces/{NS}", json={"cases": N, "source": source_of(case_file)}, headers=auth)
        assert r.status_code == 200, r.text
        for case in cases_of(case_file):
            gold = case.pop("answer")
            shown = client.post(f"/v1/namespaces/{NS}/recall", json=case, headers=auth).json()
            reply = own_agent_script.scripted(case["options"], shown["items"])
            assert client.post(f"/v1/namespaces/{NS}/record", json={"case_id": case["case_id"], **reply},
                               headers=auth).status_code == 200
            fb = client.post(f"/v1/namespaces/{NS}/feedback", json={"case_id": case["case_id"], "outcome": gold},
                             headers=auth)
            assert fb.status_code == 200, fb.text
        verified = client.post(f"/v1/namespaces/{NS}/verify", headers=auth).json()
        assert verified["identical"] and verified["ok"]
        explained = client.get(f"/v1/namespaces/{NS}/explain/{cases_of(case_file)[5]['case_id']}", headers=auth)
        assert explained.status_code == 200
    assert log_of(db) == log_of(api_db)


def test_http_refuses_without_token_and_names_bad_fields(tmp_path, case_file):
    from starlette.testclient import TestClient

    from grandrounds.api import MemoryHub
    from grandrounds.http_api import build_app

    db = tmp_path / "auth.duckdb"
    auth = {"Authorization": "Bearer right"}
    case = cases_of(case_file)[0]
    with TestClient(build_app(MemoryHub(db), "right")) as client:
        assert client.get("/health").status_code == 200  # open
        assert client.get("/openapi.json").status_code == 401
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "right"}):
            r = client.put(f"/v1/namespaces/{NS}", json={"cases": 2}, headers=headers)
            assert r.status_code == 401
        assert client.put(f"/v1/namespaces/{NS}", json={"cases": 2}, headers=auth).status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            assert client.post(f"/v1/namespaces/{NS}/recall", json=case, headers=headers).status_code == 401
        bad = client.post(f"/v1/namespaces/{NS}/recall", json={k: v for k, v in case.items() if k != "options"},
                          headers=auth)
        assert bad.status_code == 422 and bad.json()["field"] == "options"
        bad = client.put(f"/v1/namespaces/{NS}", json={"policy": "/etc/passwd"}, headers=auth)
        assert bad.status_code == 422 and bad.json()["field"] == "policy"
        bad = client.post(f"/v1/namespaces/{NS}/recall", content=b"{not json", headers=auth)
        assert bad.status_code == 422
        assert client.post(f"/v1/namespaces/{NS}/recall", json=case, headers=auth).status_code == 200
        bad = client.post(f"/v1/namespaces/{NS}/record",
                          json={"case_id": case["case_id"], "answer": "A", "usage": {"prompt_tokens": "many"}},
                          headers=auth)
        assert bad.status_code == 422 and bad.json()["field"] == "usage.prompt_tokens"
        wrong = client.post(f"/v1/namespaces/{NS}/feedback", json={"case_id": case["case_id"], "outcome": "A"},
                            headers=auth)
        assert wrong.status_code == 409  # no answer recorded yet
    with EventStore(str(db), read_only=True) as store:  # refused requests wrote nothing: run.started only
        assert [e.type for e in store.read(NS)] == ["run.started"]


def test_committed_openapi_is_the_served_one(tmp_path):
    from starlette.testclient import TestClient

    from grandrounds.api import MemoryHub
    from grandrounds.http_api import build_app, openapi_json

    with TestClient(build_app(MemoryHub(tmp_path / "o.duckdb"), "t")) as client:
        served = client.get("/openapi.json", headers={"Authorization": "Bearer t"}).json()
    committed = (ROOT / "docs" / "openapi.json").read_text(encoding="utf-8")
    assert json.loads(committed) == served
    assert committed == openapi_json()  # byte for byte: regenerate with `grandrounds serve --openapi`


def test_serve_refuses_a_public_address_without_a_token(tmp_path, monkeypatch):
    monkeypatch.delenv("GRANDROUNDS_API_TOKEN", raising=False)
    db = tmp_path / "no.duckdb"
    result = CliRunner().invoke(main, ["serve", "--db", str(db), "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "without a token" in result.output
    assert not db.exists()


def test_two_http_clients_at_once_lose_nothing(tmp_path, case_file):
    """Two clients, one memory: the server (the file's one writer) takes their requests concurrently; a
    recall of one client's case waits while the other's is open. Every case lands, the chain holds, the
    run re-executes to the same bytes."""
    import httpx
    import uvicorn

    from grandrounds.api import MemoryHub
    from grandrounds.http_api import build_app

    from grandrounds.http_api import listening_socket

    db = tmp_path / "two.duckdb"
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(MemoryHub(db), "tok"), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer tok"}
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            threading.Event().wait(0.05)
        assert httpx.put(f"{base}/v1/namespaces/{NS}", json={"cases": N}, headers=auth).status_code == 200
        cases = cases_of(case_file)
        errors: list[str] = []

        def client(mine: list[dict]) -> None:
            with httpx.Client(base_url=base, headers=auth, timeout=60) as http:
                for case in mine:
                    gold = case.pop("answer")
                    shown = http.post(f"/v1/namespaces/{NS}/recall", json=case)
                    if shown.status_code != 200:
                        errors.append(shown.text)
                        return
                    reply = own_agent_script.scripted(case["options"], shown.json()["items"])
                    http.post(f"/v1/namespaces/{NS}/record", json={"case_id": case["case_id"], **reply})
                    fb = http.post(f"/v1/namespaces/{NS}/feedback", json={"case_id": case["case_id"], "outcome": gold})
                    if fb.status_code != 200:
                        errors.append(fb.text)

        threads = [threading.Thread(target=client, args=(cases[i::2],)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors
        verified = httpx.post(f"{base}/v1/namespaces/{NS}/verify", headers=auth, timeout=120).json()
    finally:
        server.should_exit = True
        thread.join(30)
    assert verified["identical"] and verified["ok"] and verified["chain_intact"]
    with EventStore(str(db), read_only=True) as store:
        events = store.read(NS)
        assert [e.seq for e in events] == list(range(len(events)))
        received = sorted(e.case_id for e in events if e.type == "case.received")
        assert received == sorted(c["case_id"] for c in cases)
        assert sum(e.type == "case.completed" for e in events) == N


def test_mcp_stdio_session_gives_the_same_fingerprint(api_db, case_file, tmp_path):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    db = tmp_path / "mcp.duckdb"
    params = StdioServerParameters(command=sys.executable, args=[
        "-c", "from grandrounds.cli import main; main()", "mcp", "--db", str(db), "--namespace", NS, "--cases", str(N),
        "--source", source_of(case_file)])

    async def drive() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name for t in (await session.list_tools()).tools}
            assert {"recall", "record", "feedback", "explain", "history"} <= tools
            for case in cases_of(case_file):
                gold = case.pop("answer")
                shown = (await session.call_tool("recall", {"case": case})).structured_content
                reply = own_agent_script.scripted(case["options"], shown["items"])
                out = await session.call_tool("record", {"case_id": case["case_id"], **reply})
                assert not out.is_error, out
                fb = await session.call_tool("feedback", {"case_id": case["case_id"], "outcome": gold})
                assert not fb.is_error, fb
            explained = await session.call_tool("explain", {"case_id": cases_of(case_file)[3]["case_id"]})
            assert not explained.is_error

    asyncio.run(drive())
    assert log_of(db) == log_of(api_db)


def test_a_plain_letter_agent_and_bad_replies(tmp_path, case_file, monkeypatch):
    """`agent(case, memory)` returning "B" works; an answer outside the options is recorded as no answer."""
    monkeypatch.chdir(Path(__file__).parent)
    db = tmp_path / "letter.duckdb"
    result = CliRunner().invoke(main, ["run", str(case_file), "--db", str(db), "--agent",
                                       "own_agent_script:letter_agent", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    with EventStore(str(db), read_only=True) as store:
        answers = [e.payload["answer"] for e in store.read(out["run_id"]) if e.type == "answer.given"]
    assert answers == ["A"] * N
    bad = CliRunner().invoke(main, ["run", str(case_file), "--db", str(db), "--agent", "own_agent_script:nope"])
    assert bad.exit_code == 2 and "no attribute" in bad.output
    with Memory.open(tmp_path / "z.duckdb", namespace="z", cases=1) as memory:
        case = cases_of(case_file)[0]
        memory.recall(case)
        memory.record(case["case_id"], answer="Z")
        result = memory.feedback(case["case_id"])
        assert result.answer == "" and not result.correct
        with pytest.raises(Exception, match="already holds"):
            memory.recall(case)
    assert AgentReply(answer="B").answer == "B"


def test_mcp_streamable_http_needs_the_token_and_serves_the_tools(tmp_path, case_file):
    import os
    import subprocess
    import time

    import httpx
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from grandrounds.http_api import listening_socket

    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    db = tmp_path / "mcp-http.duckdb"
    env = dict(os.environ, GRANDROUNDS_API_TOKEN="mcp-token")
    server = subprocess.Popen([sys.executable, "-c", "from grandrounds.cli import main; main()", "mcp", "--db",
                               str(db), "--namespace", NS, "--cases", "2", "--transport", "streamable-http",
                               "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        for _ in range(600):
            try:
                refused = httpx.post(url, json={})
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert refused.status_code == 401  # no token: refused before the MCP layer

        async def drive() -> bool:
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer mcp-token"}) as http, \
                    streamable_http_client(url, http_client=http) as (read, write, *_), \
                    ClientSession(read, write) as session:
                await session.initialize()
                ok = True
                for case in cases_of(case_file)[:2]:
                    gold = case.pop("answer")
                    shown = (await session.call_tool("recall", {"case": case})).structured_content
                    reply = own_agent_script.scripted(case["options"], shown["items"])
                    await session.call_tool("record", {"case_id": case["case_id"], **reply})
                    fb = await session.call_tool("feedback", {"case_id": case["case_id"], "outcome": gold})
                    ok &= not fb.is_error
                return ok

        assert asyncio.run(drive())
    finally:
        server.terminate()
        server.wait(30)
    result = CliRunner().invoke(main, ["verify", "--db", str(db), NS, "--json"])
    assert result.exit_code == 0 and json.loads(result.output.strip().splitlines()[-1])["ok"]
