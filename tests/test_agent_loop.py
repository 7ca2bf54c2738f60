"""The ReAct loop, its context guard, structured reflection and failure handling."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES
from fake_openai_server import FakeOpenAI
from grandrounds.handlers.llm.errors import ModelOutage
from grandrounds.store.attempts import failed_attempts
from grandrounds.handlers.agent.guard import FINAL_NOTICE, LOOP_NOTICE, TRIM_NOTICE, GuardConfig, HistoryTurn, render
from grandrounds.handlers.agent.protocol import align_answer, fallback_answer, parse_turn
from grandrounds.handlers.cases import load_cases
from llm_helpers import live_options, openai_spec, run
from grandrounds.store.eventstore import EventStore

OPTIONS = {"A": "Temporal artery biopsy", "B": "Bacterial meningitis", "C": "Aortic dissection"}


@pytest.fixture(scope="module")
def cases():
    return load_cases(EXAMPLES)[0][:4]


# --- protocol ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, kind, detail", [
    ('<reasoning>r</reasoning><tool>{"name": "ddx", "arguments": {"q": 1}}</tool>', "tool", "ddx"),
    ("<reasoning>r</reasoning><response>B</response>", "response", "B"),
    ("<reasoning>r</reasoning><response>Aortic dissection</response>", "response", "C"),
    ("<reasoning>r</reasoning><tool>{bad</tool>", "invalid", "Parse error"),
    ('<reasoning>r</reasoning><tool>{"name": "mri"}</tool>', "invalid", "unknown tool 'mri'"),
    ("<reasoning>r</reasoning>", "invalid", "missing action"),
    ("<reasoning>r</reasoning><response>B</response><response>C</response>", "invalid", "exactly one action"),
    ("<reasoning>r</reasoning><response>maybe</response>", "invalid", "one option letter"),
])
def test_parse_turn(text, kind, detail):
    turn = parse_turn(text, OPTIONS, ["ddx"])
    assert turn.kind == kind
    assert detail in (turn.tool or turn.answer or turn.error or "")


def test_last_step_forbids_tools_and_falls_back_to_untagged_text():
    turn = parse_turn('<reasoning>r</reasoning><tool>{"name": "ddx"}</tool>', OPTIONS, ["ddx"], tools_allowed=False)
    assert turn.kind == "invalid" and "disabled" in turn.error
    assert fallback_answer("<reasoning>so</reasoning> the answer is B", OPTIONS) == "B"
    assert fallback_answer("I am not sure", OPTIONS) is None
    assert align_answer("Answer: (c)", OPTIONS) == "C"


# --- context guard -------------------------------------------------------------------------


def _turn(i: int, sig: str | None = None, obs_len: int = 50) -> HistoryTurn:
    return HistoryTurn(output=f"<reasoning>{i}</reasoning>", observation=f"obs{i} " + "x" * obs_len,
                       signature=sig or f"t:{i}", finding=True)


def test_guard_trims_old_observations_only_over_budget_and_keeps_the_last_three():
    history = [_turn(i, obs_len=1000) for i in range(6)]
    small = render("sys", "task", history, 7, False, GuardConfig(token_budget=100_000))
    assert TRIM_NOTICE not in small[-1]["content"] and all("[trimmed]" not in m["content"] for m in small)
    cfg = GuardConfig(token_budget=1000)
    msgs = render("sys", "task", history, 7, False, cfg)
    obs = [m["content"] for m in msgs if m["content"].startswith("Observation:")]
    assert all("[trimmed]" in o and len(o) < 260 for o in obs[:3])
    assert all("[trimmed]" not in o and len(o) > 1000 for o in obs[3:5])
    assert TRIM_NOTICE in msgs[-1]["content"]
    assert len(history[0].observation) > 1000  # the recorded trajectory is untouched


def test_guard_loop_notice_pinned_findings_and_final_step():
    looping = [_turn(0), _turn(1, "same"), _turn(2, "same"), _turn(3, "same")]
    msgs = render("sys", "task", looping, 5, True)
    last = msgs[-1]["content"]
    assert LOOP_NOTICE.format(n=3) in last and "## Pinned findings" in last and FINAL_NOTICE in last
    early = render("sys", "task", looping[:2], 3, False)[-1]["content"]
    assert "Loop notice" not in early and "Pinned" not in early and "Final step" not in early
    assert [m["role"] for m in msgs] == ["system", "user"] + ["assistant", "user"] * 4


# --- the loop against the fake server ------------------------------------------------------


def _payloads(store, run_id, type_, case_id=None):
    return [e.payload for e in store.iter(run_id, types=[type_], case_id=case_id)]


def test_memory_block_is_rendered_each_step_but_not_kept_in_the_conversation(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        run(store, cases, openai_spec({"ddx-lookup": 0.9}), "r", live_options(server))
        ex = [x for x in _payloads(store, "r", "llm.exchange") if x["stage"] == "act"]
    with_memory = [x for x in ex if "## Memory" in x["messages"][1]["content"]]
    assert with_memory
    for x in ex:
        assert all("## Memory" not in m["content"] for m in x["messages"][2:])
    second_steps = [x for x in ex if x["purpose"] == "react-step-2"]
    assert second_steps and all(x["messages"][1]["content"].count("## Memory") == 1 for x in second_steps)


def test_a_case_without_a_valid_answer_is_graded_wrong_and_still_teaches_memory(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        server.script = [("act", "garbage")] * 3
        out = run(store, cases[:1], openai_spec(), "r", live_options(server, max_steps=3))
        answers = _payloads(store, "r", "answer.given")
        feedback = _payloads(store, "r", "feedback.recorded")
        types = [e.type for e in store.iter("r")]
    assert out.summary["cases"] == 1 and out.summary["correct"] == 0 and out.summary["failed"] == 0
    assert out.summary["metrics"]["unanswered"] == 1 and out.summary["metrics"]["answer_sources"] == {"none": 1}
    assert answers[0]["answer"] == "" and answers[0]["source"] == "none"
    assert "no valid answer after 3 steps" in answers[0]["steps"][-1]["content"]
    assert [s["kind"] for s in answers[0]["steps"]].count("observation") == 4
    assert feedback[0]["correct"] is False and feedback[0]["answer"] == ""
    for t in ("reflection.recorded", "episode.stored"):
        assert t in types  # errors teach memory too
    assert "case.failed" not in types and "case.completed" in types
    assert out.summary["memory"]["episodes"] == 1


def test_exhausted_retries_stop_the_run_as_an_outage_with_every_attempt_kept(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        server.script = [("act", "500")] * 4
        with pytest.raises(ModelOutage, match="after 4 attempt") as info:
            run(store, cases[:2], openai_spec(), "r", live_options(server))
        assert _payloads(store, "r", "case.failed") == [] and _payloads(store, "r", "llm.exchange") == []
        assert [a["kind"] for a in failed_attempts(store, "r")] == ["server"] * 4
    assert info.value.cases_left == 2  # not a result: the same command resumes at case 1


def test_auth_errors_are_not_retried_and_are_an_outage(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        server.script = [("act", "401")]
        with pytest.raises(ModelOutage, match="auth"):
            run(store, cases[:1], openai_spec(), "r", live_options(server))
        assert [(a["kind"], a["attempt"]) for a in failed_attempts(store, "r")] == [("auth", 1)]
        assert len(server.requests) == 1


def test_structured_reflection_uses_json_schema(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        run(store, cases[:1], openai_spec(), "r", live_options(server))
        refl = [x for x in _payloads(store, "r", "llm.exchange") if x["stage"] == "reflect"]
        rules = _payloads(store, "r", "rule.added")
    assert len(refl) == 1 and refl[0]["params"]["response_format"]["type"] == "json_schema"
    assert "ReflectionDraft" == refl[0]["params"]["response_format"]["json_schema"]["name"]
    assert rules and "favour" in rules[0]["text"]


def test_servers_without_json_schema_get_the_schema_in_the_prompt(cases):
    with FakeOpenAI(schema_supported=False) as server, EventStore(":memory:") as store:
        run(store, cases[:1], openai_spec(), "r", live_options(server))
        refl = [x for x in _payloads(store, "r", "llm.exchange") if x["stage"] == "reflect"]
        assert _payloads(store, "r", "reflection.recorded")
    assert [x["outcome"] for x in refl] == ["error", "ok"]
    assert refl[0]["error"].startswith("bad_request:")
    assert refl[1]["purpose"] == "reflection-prompt-json" and "response_format" not in refl[1]["params"]
    assert "JSON schema" in refl[1]["messages"][-1]["content"]


def test_malformed_reflection_gets_one_repair_then_the_case_is_marked(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        server.script = [("reflect", "bad_reflection")]
        run(store, cases[:1], openai_spec(), "ok", live_options(server))
        repaired = [x["purpose"] for x in _payloads(store, "ok", "llm.exchange") if x["stage"] == "reflect"]
        assert _payloads(store, "ok", "reflection.recorded") and not _payloads(store, "ok", "case.failed")

        server.script = [("reflect", "bad_reflection")] * 2
        out = run(store, cases[:1], openai_spec(), "bad", live_options(server))
        failed = _payloads(store, "bad", "case.failed")
        types = [e.type for e in store.iter("bad")]
    assert repaired == ["reflection", "reflection-repair"]
    assert failed[0]["stage"] == "reflect" and "after one repair" in failed[0]["reason"]
    # no lesson from it (no rule, no guideline), but the case itself is an episode (episode_without_reflection)
    assert "feedback.recorded" in types and "rule.added" not in types
    assert types.index("episode.stored") > types.index("case.failed")
    assert out.summary["cases"] == 1 and out.summary["memory"]["episodes"] == 1
