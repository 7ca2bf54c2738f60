"""Model outages are outages (issue 13 item 4): the fault matrix against a misbehaving local server.

Every HTTP-level fault the fake server can inject (tests/fake_openai_server.py `FAULTS`) is run twice:
- once (transient): the gateway retries it, the run completes, and its fingerprint is the clean run's
  (the failed attempt is in the meta of the exchange that succeeded and in `llm_attempts`, not an event);
- on every request (persistent): the run stops with `ModelOutage` naming the endpoint and the cases
  left, and nothing of the interrupted case is written (no `case.failed`), so a rerun resumes it.
A reply that is merely unusable (`garbage`) stays a recorded, incorrect answer. Then the CLI: a
preflight that fails fast with nothing written, and a rerun after an outage that completes exactly
the missing cases and ends with the outage-free fingerprint.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from fake_openai_server import FAULTS, FakeOpenAI
from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.llm.errors import ModelOutage
from grandrounds.handlers.llm.gateway import RetryPolicy
from grandrounds.handlers.llm.preflight import preflight
from grandrounds.store.attempts import failed_attempts
from grandrounds.store.eventstore import EventStore
from llm_helpers import MODEL, SECRET, live_options, openai_spec, run

KIND = {"500": "server", "503_html": "server", "429": "rate_limit", "html_200": "malformed",
        "not_json": "malformed", "error_200": "malformed", "no_choices": "malformed", "truncated": "connection",
        "drop": "connection", "hang": "timeout", "oversized": "malformed"}
RETRY = RetryPolicy(max_attempts=3, backoff_s=0.0)
TIMEOUT = 1.0  # the fake's `hang` stalls 3 s


@pytest.fixture(scope="module")
def cases():
    return load_cases(EXAMPLES)[0][:1]  # one case is enough: every fault hits its first request


@pytest.fixture(scope="module")
def clean(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        run(store, cases, openai_spec(), "r", live_options(server, retry=RETRY, timeout=TIMEOUT))
        return store.fingerprint("r")


def test_every_fault_kind_is_classified():
    assert set(KIND) == set(FAULTS) and len(FAULTS) >= 8


@pytest.mark.parametrize("fault", FAULTS)
def test_a_transient_fault_is_retried_and_leaves_the_clean_fingerprint(fault, cases, clean):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        server.script = [("act", fault)]
        outcome = run(store, cases, openai_spec(), "r", live_options(server, retry=RETRY, timeout=TIMEOUT))
        assert outcome.summary["cases"] == 1 and outcome.summary["failed"] == 0
        assert store.fingerprint("r") == clean  # the outage left no trace in the events
        rows = failed_attempts(store, "r")
        assert [(r["kind"], r["attempt"], r["case_id"], r["stage"]) for r in rows] == [
            (KIND[fault], 1, cases[0].case_id, "act")]
        metas = [e.meta["failed_attempts"] for e in store.iter("r", types=["llm.exchange"])
                 if e.meta.get("failed_attempts")]
        assert [[a["kind"] for a in m] for m in metas] == [[KIND[fault]]]
        assert outcome.summary["llm"]["failed_attempts"] == 1
        assert SECRET not in json.dumps(rows) + json.dumps(metas)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_persistent_fault_stops_the_run_and_writes_nothing_of_the_case(fault, cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        server.script = [("any", fault)] * 10
        with pytest.raises(ModelOutage) as info:
            run(store, cases, openai_spec(), "r", live_options(server, retry=RETRY, timeout=TIMEOUT))
        exc = info.value
        assert exc.kind == KIND[fault] and exc.endpoint == server.base_url and exc.case_id == cases[0].case_id
        assert exc.cases_left == 1 and exc.run_id == "r"
        types = [e.type for e in store.iter("r")]
        assert "case.failed" not in types and "case.received" not in types  # not a result: resumable
        expected = 2 if fault == "hang" else 3  # a hang costs at most max_timeouts attempts
        assert [r["attempt"] for r in failed_attempts(store, "r")] == list(range(1, expected + 1))


def test_an_unusable_answer_is_a_recorded_incorrect_answer_not_an_outage(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        server.script = [("act", "garbage")] * 20
        outcome = run(store, cases, openai_spec(), "r", live_options(server, retry=RETRY, timeout=TIMEOUT))
        assert outcome.summary["cases"] == 1 and failed_attempts(store, "r") == []
        # recorded as an answer without a valid option (source none): counted, graded incorrect, reflected on
        assert outcome.summary["metrics"]["unanswered"] == 1 and outcome.summary["correct"] == 0


def test_retry_waits_are_bounded_jittered_and_honour_retry_after():
    p = RetryPolicy(max_attempts=5, backoff_s=1.0, max_backoff_s=5.0)
    waits = [p.wait(3, None) for _ in range(200)]
    assert all(2.0 <= w <= 4.0 for w in waits) and len(set(waits)) > 1  # 4 s with jitter 0.5-1
    assert all(p.wait(10, None) <= 5.0 for _ in range(50))
    assert p.wait(1, 3.0) == 3.0 and p.wait(1, 60.0) == 5.0


# --- the CLI: preflight and resuming after an outage --------------------------------------------


def _cli(args, env=None):
    r = CliRunner().invoke(main, ["run", *args], env={"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": "", **(env or {})})
    return r


def test_preflight_fails_fast_names_the_endpoint_and_writes_nothing(tmp_path):
    cases = tmp_path / "c.jsonl"
    cases.write_text(EXAMPLES.read_text().splitlines()[0] + "\n")
    db = tmp_path / "p.duckdb"
    r = _cli([str(cases), "--db", str(db), "--backbone", "openai", "--base-url", "http://127.0.0.1:9/v1",
              "--model", MODEL])
    assert r.exit_code == 1 and "127.0.0.1:9" in r.stderr and "connection" in r.stderr
    assert "nothing was written" in r.stderr and not db.exists()
    with FakeOpenAI(models=["other-model"]) as server:
        r = _cli([str(cases), "--db", str(db), "--base-url", server.base_url, "--model", MODEL, "--json"])
        assert r.exit_code == 1 and "not served here" in json.loads(r.stdout)["error"] and not db.exists()
        assert server.requests == []
    with FakeOpenAI(models=[MODEL]) as listed, FakeOpenAI() as unlisted:
        assert preflight(listed.base_url, SECRET, MODEL) == "listed" and listed.pings == 0
        assert preflight(unlisted.base_url, SECRET, MODEL) == "chat" and unlisted.pings == 1  # no /models route
        assert listed.requests == unlisted.requests == []
    with FakeOpenAI(models="html") as html:  # HTML where the model list should be: an outage, not a crash
        with pytest.raises(ModelOutage, match="malformed"):
            preflight(html.base_url, SECRET, MODEL)


def test_rerun_after_an_outage_completes_exactly_the_missing_cases_to_the_clean_fingerprint(tmp_path):
    cases = tmp_path / "c.jsonl"
    cases.write_text("\n".join(EXAMPLES.read_text().splitlines()[:3]) + "\n")
    ids = [json.loads(line)["case_id"] for line in cases.read_text().splitlines()]
    # --actions text: no json_schema probe request, so the requests counted below are the cases' own
    common = ["--model", MODEL, "--run-id", "r", "--max-attempts", "2", "--actions", "text", "--json"]
    with FakeOpenAI() as server:  # outage-free reference, and how many requests case 1 takes
        r = _cli([str(cases), "--db", str(tmp_path / "clean.duckdb"), "--base-url", server.base_url, *common])
        assert r.exit_code == 0, r.output
        clean = json.loads(r.stdout)
        first = [q["messages"][1]["content"] for q in server.requests[:clean["llm"]["per_case"][0]["calls"]]]
    db = str(tmp_path / "out.duckdb")
    with FakeOpenAI() as server:  # case 1 answered, then the endpoint returns a broken body for good
        server.script = [("any", "pass")] * len(first) + [("any", "not_json")] * 10
        r = _cli([str(cases), "--db", db, "--base-url", server.base_url, *common])
        assert r.exit_code == 1, r.output  # not 2 (bad input), not 0 (baked in)
        out = json.loads(r.stdout)["outage"]
        assert out["endpoint"] == server.base_url and out["cases_not_completed"] == 2 and out["case_id"] == ids[1]
        assert "connection or server errors" in r.stderr and server.base_url in r.stderr
    with EventStore(db, read_only=True) as store:
        done = [e.case_id for e in store.iter("r", types=["case.completed"])]
        assert done == ids[:1] and not list(store.iter("r", types=["case.failed"]))
        assert [a["case_id"] for a in failed_attempts(store, "r")] == [ids[1], ids[1]]
    with FakeOpenAI() as server:  # back: the same command finishes the two missing cases
        r = _cli([str(cases), "--db", db, "--base-url", server.base_url, *common])
        assert r.exit_code == 0, r.output
        again = json.loads(r.stdout)
        assert not any(q["messages"][1]["content"] in first for q in server.requests)  # case 1 was not redone
    assert again["fingerprint"] == clean["fingerprint"] and again["cases"] == 3
    assert not any("already complete" in n for n in again["notes"])
    assert os.path.exists(db)


def test_an_older_log_with_retry_events_is_served_without_new_attempts():
    """Logs written before this change hold failed attempts as exchange events: the record backend
    still serves them (a retry without waiting), and nothing is noted as a new attempt."""
    import asyncio
    from collections import deque

    from grandrounds.handlers.llm.gateway import LLMGateway, request_hash
    from grandrounds.handlers.llm.record import RecordedExchanges, RecordedTransport
    from grandrounds.handlers.llm.recorder import Recorder
    from grandrounds.store.llm_events import LLMExchange, LLMMessage

    messages = [{"role": "user", "content": "q"}]
    params = {"temperature": 0.0, "max_tokens": 1024}
    h = request_hash(MODEL, messages, params)
    common = dict(stage="act", purpose="p", request_hash=h, model=MODEL, params=params,
                  messages=[LLMMessage(role="user", content="q")])
    old = [LLMExchange(**common, attempt=1, outcome="error", error="server: boom", retryable=True),
           LLMExchange(**common, attempt=2, outcome="ok", response="B")]
    emitted, noted = [], []
    rec = Recorder("c", "act", lambda p, m: emitted.append((p, m)) or len(emitted), noted.append)
    gw = LLMGateway(RecordedTransport(RecordedExchanges("old", {h: deque(old)})), MODEL)
    reply = asyncio.run(gw.complete(messages, rec, "p"))
    assert reply.text == "B" and noted == []
    assert [(p.outcome, p.attempt) for p, _ in emitted] == [("ok", 1)]
    assert [a["kind"] for a in emitted[0][1]["failed_attempts"]] == ["server"]
