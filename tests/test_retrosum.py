"""RetroSum in the agent loop: a summary of the whole raw history every w steps, recorded as an
exchange before use, shown to the actor after the raw turns, kept in the trajectory, and served
back by the record backend with the server stopped."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES
from fake_openai_server import FakeOpenAI
from grandrounds.handlers.agent.guard import SUMMARY_HEADER, GuardConfig, HistoryTurn, render
from grandrounds.handlers.agent.retrosum import due, summariser_messages
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.llm.record import RecordedExchanges
from llm_helpers import live_options, openai_spec, run
from grandrounds.store.eventstore import EventStore

TOOLS = {"ddx-lookup": 0.9}
# Four broken turns keep the agent going; step 5 is final and answers by lexical overlap.
SCRIPT = [("act", "bad_json_tool"), ("act", "unknown_tool"), ("act", "no_action"), ("act", "no_action")]
RETRO = {"max_steps": 5, "summary_every": 2}


@pytest.fixture(scope="module")
def case():
    return load_cases(EXAMPLES)[0][0]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, case):
    db = tmp_path_factory.mktemp("retro") / "runs.duckdb"
    server = FakeOpenAI().start()
    server.script = list(SCRIPT)
    try:
        with EventStore(db) as store:
            outcome = run(store, [case], openai_spec(TOOLS), "live", live_options(server, **RETRO))
            exchanges = [e.payload for e in store.iter("live", types=["llm.exchange"]) if e.payload["stage"] == "act"]
            answer = next(store.iter("live", types=["answer.given"])).payload
    finally:
        server.stop()
    return db, outcome, exchanges, answer


def _by_purpose(exchanges):
    return {x["purpose"]: x for x in exchanges}


def test_due_every_w_steps_but_never_after_the_final_one():
    assert [s for s in range(1, 8) if due(s, 2, s == 7)] == [2, 4, 6]
    assert [s for s in range(1, 8) if due(s, 10, s == 7)] == []  # the default: off within 7 steps
    assert not due(4, 0, False) and not due(4, 4, True)


def test_summaries_are_written_at_steps_2_and_4_and_recorded_before_use(recorded):
    _, outcome, exchanges, answer = recorded
    assert [x["purpose"] for x in exchanges] == ["react-step-1", "react-step-2", "summarise-step-2", "react-step-3",
                                                 "react-step-4", "summarise-step-4", "react-step-5"]
    assert outcome.summary["failed"] == 0
    kinds = [s["kind"] for s in answer["steps"]]
    assert kinds.count("summary") == 2 and kinds.count("reasoning") == 5 and kinds[-1] == "response"
    # each summary sits right after the observation of the step it was written at
    obs_idx = [i for i, k in enumerate(kinds) if k == "observation"]
    assert [i for i, k in enumerate(kinds) if k == "summary"] == [obs_idx[1] + 1, obs_idx[3] + 1]
    summaries = [s["content"] for s in answer["steps"] if s["kind"] == "summary"]
    by = _by_purpose(exchanges)
    assert summaries == [by["summarise-step-2"]["response"].strip(), by["summarise-step-4"]["response"].strip()]


def test_the_summariser_rereads_the_whole_raw_history(recorded):
    _, _, exchanges, answer = recorded
    by = _by_purpose(exchanges)
    observations = [s["content"] for s in answer["steps"] if s["kind"] == "observation"]
    for j in (2, 4):
        prompt = by[f"summarise-step-{j}"]["messages"][1]["content"]
        for k in range(1, j + 1):
            assert f"### Step {k}\nAgent: {by[f'react-step-{k}']['response']}" in prompt
            assert f"Observation: {observations[k - 1]}" in prompt
        assert f"### Step {j + 1}" not in prompt
        assert "## Memory" not in prompt  # the memory block goes to the actor only


def test_the_actor_sees_raw_history_plus_the_latest_summary(recorded):
    _, _, exchanges, _ = recorded
    by = _by_purpose(exchanges)
    s2, s4 = by["summarise-step-2"]["response"].strip(), by["summarise-step-4"]["response"].strip()
    for k in (1, 2):
        assert "Retrospective summary" not in by[f"react-step-{k}"]["messages"][-1]["content"]
    for k, latest, old in ((3, s2, None), (4, s2, None), (5, s4, s2)):
        msgs = by[f"react-step-{k}"]["messages"]
        last = msgs[-1]["content"]
        header = SUMMARY_HEADER.format(step=2 if k < 5 else 4)
        assert header + "\n" + latest in last
        assert old is None or old not in last
        assert [m["role"] for m in msgs] == ["system", "user"] + ["assistant", "user"] * (k - 1)  # raw turns kept


def test_the_record_backend_reexecutes_a_retrosum_run_with_the_server_stopped(recorded, case):
    db, outcome, _, _ = recorded
    with EventStore(db) as store:
        rec = RecordedExchanges.from_store(store, "live")
        again = run(store, [case], openai_spec(TOOLS), "replayed", {"recorded": rec, **RETRO})
        served = {e.meta["served"] for e in store.iter("replayed", types=["llm.exchange"])}
    assert again.summary["fingerprint"] == outcome.summary["fingerprint"]
    assert rec.remaining == 0 and served == {"record"}


def test_a_failing_summariser_fails_the_case_with_its_trajectory(case):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        # the server refuses the summary request itself (400, e.g. over its context): the case fails;
        # an unreachable server would instead stop the run (tests/test_model_outages.py)
        server.script = [("act", "no_action"), ("summarise", "400")]
        out = run(store, [case], openai_spec(), "r", live_options(server, max_steps=3, summary_every=1))
        failed = [e.payload for e in store.iter("r", types=["case.failed"])]
        types = [e.type for e in store.iter("r")]
    assert out.summary["failed"] == 1 and "summary after step 1" in failed[0]["reason"]
    assert [s["kind"] for s in failed[0]["steps"]] == ["reasoning", "observation"]
    assert "answer.given" not in types and "rule.added" not in types


def test_summariser_input_is_untrimmed_while_the_actor_prompt_is_trimmed():
    from grandrounds.handlers.cases import Case

    view = Case(case_id="c", kind="mcq", question="q?", options={"A": "a", "B": "b"}, answer="A").view()
    history = [HistoryTurn(f"<reasoning>{i}</reasoning>", f"obs{i} " + "x" * 1000, f"t:{i}", True) for i in range(6)]
    actor = render("sys", "task", history, 7, False, GuardConfig(token_budget=1000), summary=(6, "S"))
    assert sum("[trimmed]" in m["content"] for m in actor) == 3 and SUMMARY_HEADER.format(step=6) + "\nS" in actor[-1]["content"]
    summariser = summariser_messages(view, history)[1]["content"]
    assert all(f"Observation: {t.observation}" in summariser for t in history)
