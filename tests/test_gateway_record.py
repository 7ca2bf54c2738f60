"""A run against a local fake OpenAI-compatible server, re-executed from its record with the
server stopped: same fingerprint; a miss is a divergence naming case and stage; retries and
corrective observations are recorded; the API key never reaches the DuckDB file."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES
from fake_openai_server import FakeOpenAI
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.llm.errors import ReplayDivergence
from grandrounds.handlers.llm.record import RecordedExchanges
from grandrounds.store.attempts import failed_attempts
from llm_helpers import MODEL, SECRET, live_options, openai_spec, run
from grandrounds.store.eventstore import EventStore


@pytest.fixture(scope="module")
def cases():
    return load_cases(EXAMPLES)[0][:6]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, cases):
    """One live run with a 429, a 500 and a malformed tool call scripted in, on a file DB."""
    db = tmp_path_factory.mktemp("rec") / "runs.duckdb"
    server = FakeOpenAI().start()
    server.script = [("act", "429"), ("act", "500"), ("act", "bad_json_tool"), ("act", "unknown_tool")]
    try:
        with EventStore(db) as store:
            outcome = run(store, cases, openai_spec({"ddx-lookup": 0.9}), "live", live_options(server))
    finally:
        server.stop()
    return db, outcome, server


def test_live_run_completes_and_reports_tokens(recorded, cases):
    _, outcome, server = recorded
    s = outcome.summary
    assert s["cases"] == len(cases) and s["backbone"] == "openai"
    assert s["llm"]["calls"] > 0 and s["llm"]["prompt_tokens"] > 0 and s["failed"] == 0
    assert len(s["llm"]["per_case"]) == len(cases)
    assert all(row["calls"] >= 2 for row in s["llm"]["per_case"])  # act + reflect
    assert "openai backbone" in outcome.note and MODEL in outcome.note
    assert server.auth_headers and all(h == f"Bearer {SECRET}" for h in server.auth_headers)


def test_retries_are_kept_beside_the_log_not_in_it(recorded):
    db, _, _ = recorded
    with EventStore(db, read_only=True) as store:
        events = list(store.iter("live", types=["llm.exchange"]))
        attempts = failed_attempts(store, "live")
    first = events[0]
    assert first.payload["outcome"] == "ok" and first.payload["attempt"] == 1 and first.payload["usage"]["total_tokens"]
    assert [a["kind"] for a in first.meta["failed_attempts"]] == ["rate_limit", "server"]
    assert all(e.payload["outcome"] == "ok" for e in events)  # transport failures are not events
    assert [(a["kind"], a["attempt"], a["request_hash"]) for a in attempts] == [
        ("rate_limit", 1, first.payload["request_hash"]), ("server", 2, first.payload["request_hash"])]


def test_malformed_output_gets_a_corrective_observation(recorded, cases):
    db, _, _ = recorded
    with EventStore(db, read_only=True) as store:
        answer = next(store.iter("live", types=["answer.given"], case_id=cases[0].case_id)).payload
        meta = [e.meta for e in store.iter("live", types=["llm.exchange"])]
    observations = [s["content"] for s in answer["steps"] if s["kind"] == "observation"]
    assert any(o.startswith("Parse error: the <tool> block is not valid JSON") for o in observations)
    assert any(o.startswith("Tool error: unknown tool 'xray-reader'") for o in observations)
    assert answer["steps"][-1]["kind"] == "response" and answer["tool_calls"]
    assert all(m["served"] == "live" and m["latency_ms"] >= 0 for m in meta)


def test_record_backend_reproduces_the_fingerprint_with_the_server_stopped(recorded, cases):
    db, outcome, _ = recorded
    with EventStore(db) as store:
        rec = RecordedExchanges.from_store(store, "live")
        again = run(store, cases, openai_spec({"ddx-lookup": 0.9}), "replayed", {"recorded": rec})
        served = {e.meta["served"] for e in store.iter("replayed", types=["llm.exchange"])}
    assert again.summary["fingerprint"] == outcome.summary["fingerprint"]
    assert again.summary["events"] == outcome.summary["events"]
    assert rec.remaining == 0 and served == {"record"}
    assert "record backend" in again.note


def test_a_miss_is_a_divergence_naming_case_and_stage(recorded, cases):
    db, _, _ = recorded
    changed = list(cases)
    changed[2] = changed[2].model_copy(update={"question": changed[2].question + " He also has a rash."})
    with EventStore(db) as store:
        rec = RecordedExchanges.from_store(store, "live")
        with pytest.raises(ReplayDivergence) as err:
            run(store, changed, openai_spec({"ddx-lookup": 0.9}), "diverged", {"recorded": rec})
    msg = str(err.value)
    assert f"case {cases[2].case_id}, stage act" in msg and "react-step-1" in msg


def test_live_fallthrough_calls_the_model_on_a_miss(recorded, cases):
    db, _, _ = recorded
    changed = list(cases[:3])
    changed[2] = changed[2].model_copy(update={"question": changed[2].question + " He also has a rash."})
    with FakeOpenAI() as server, EventStore(db) as store:
        rec = RecordedExchanges.from_store(store, "live")
        out = run(store, changed, openai_spec({"ddx-lookup": 0.9}), "fallthrough",
                  live_options(server, recorded=rec, live_fallthrough=True))
        served = [e.meta["served"] for e in store.iter("fallthrough", types=["llm.exchange"])]
    assert out.summary["cases"] == 3
    assert "record" in served and "live-fallthrough" in served and server.requests


def test_the_api_key_never_reaches_the_database_file(recorded):
    db, _, _ = recorded
    assert SECRET.encode() not in db.read_bytes()
    wal = db.with_name(db.name + ".wal")
    assert not wal.exists() or SECRET.encode() not in wal.read_bytes()
