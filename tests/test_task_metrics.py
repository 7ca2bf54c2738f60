"""SELSM §2.5 run metrics (replay/task_metrics.py) on hand-built event lists, and in the summary
of a run against the fake OpenAI server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from conftest import EXAMPLES
from fake_openai_server import FakeOpenAI
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.runs import RunSpec
from llm_helpers import live_options, openai_spec, run
from grandrounds.replay.task_metrics import qab, task_metrics, task_records
from grandrounds.store.eventstore import EventStore


@dataclass(frozen=True)
class Ev:
    type: str
    case_id: str | None
    payload: dict[str, Any] = field(default_factory=dict)


def _steps(turns: int, tools: int = 0) -> list[dict]:
    out = []
    for i in range(turns):
        out.append({"kind": "reasoning", "content": f"r{i}"})
        if i < tools:
            out += [{"kind": "tool", "content": "{}"}, {"kind": "observation", "content": "t -> A"}]
    return out


def _case(cid: str, category: str = "general") -> Ev:
    return Ev("case.received", cid, {"index": 0, "case": {"case_id": cid, "kind": "mcq", "category": category}})


def _llm(cid: str, stage: str, prompt: int, completion: int, ok: bool = True) -> Ev:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return Ev("llm.exchange", cid, {"stage": stage, "outcome": "ok" if ok else "error", "usage": usage if ok else None})


def _answered(cid: str, correct: bool, turns: int, tools: int = 0, source: str = "llm") -> list[Ev]:
    return [Ev("answer.given", cid, {"answer": "A", "source": source, "steps": _steps(turns, tools)}),
            Ev("case.completed", cid, {"index": 0, "correct": correct})]


def _failed(cid: str, reason: str, turns: int) -> list[Ev]:
    return [Ev("case.failed", cid, {"stage": "act", "reason": reason, "steps": _steps(turns)}),
            Ev("case.completed", cid, {"index": 0, "correct": False})]


@pytest.fixture
def events() -> list[Ev]:
    return [
        Ev("run.started", None, {}),
        _case("c1", "query"), _llm("c1", "act", 80, 20), _llm("c1", "reflect", 40, 10), *_answered("c1", True, 1),
        _case("c2", "action"), _llm("c2", "act", 0, 0, ok=False), _llm("c2", "act", 250, 50),
        *_answered("c2", True, 3, tools=1),
        _case("c3", "query"), _llm("c3", "act", 100, 0), *_answered("c3", False, 3, source="llm:fallback"),
        _case("c4", "action"), _llm("c4", "act", 90, 0), *_failed("c4", "no valid answer after 3 steps", 3),
        _case("c5", "action"), *_failed("c5", "model unavailable at step 1: server: boom (after 4 attempt(s))", 0),
    ]


def test_primary_and_derived_metrics_on_a_hand_built_run(events):
    m = task_metrics(events)
    assert m["n"] == 5
    assert m["tc"] == 60.0  # c1, c2, c3 answered (the fallback answer counts as finished)
    assert m["sr"] == 40.0  # c1, c2
    assert m["osr"] == 20.0 and m["t_min"] == 1  # only c1 answered right on its first turn
    # c4 hit the turn limit; c5 ended on an error (model unreachable): neither invalid nor counted in ER
    assert m["r_lim"] == 0.2 and m["r_inv"] == 0.0 and m["er"] == 0.8 and m["errors"] == 1
    assert m["tokens_per_correct_task"] == 225.0  # (150 + 300) / 2, all stages
    assert m["act_tokens_per_correct_task"] == 200.0  # (100 + 300) / 2
    assert m["avg_turns"] == 2.0 and m["avg_tool_calls"] == 0.2  # (1+3+3+3+0)/5, one tool call in 5
    assert m["fallback_answers"] == 1


def test_query_action_rates_need_classified_tasks(events):
    m = task_metrics(events)  # MCQ cases are neither query nor action tasks
    assert m["q_sr"] is None and m["a_sr"] is None and m["qab"] is None and "q_sr/a_sr/qab" in m["not_computed"]
    by_category = task_metrics(events, classify=lambda case: case["category"])
    assert by_category["q_sr"] == 50.0  # c1 right, c3 wrong
    assert by_category["a_sr"] == pytest.approx(33.333333)  # c2 right of c2, c4, c5
    assert by_category["qab"] == pytest.approx(1 - (50 - 33.333333) / 50, abs=1e-6)
    assert by_category["not_computed"] == {}


def test_qab_matches_the_paper_and_handles_edges():
    assert qab(69.33, 73.33) == pytest.approx(0.945, abs=5e-4)  # SELSM §3: 0.945 for 69.3% vs 73.3%
    assert qab(50.0, 50.0) == 1.0 and qab(0.0, 40.0) == 0.0
    assert qab(None, 10.0) is None and qab(0.0, 0.0) is None


def test_records_ignore_reflect_failures_and_failed_attempts(events):
    extra = [_case("c6"), *_answered("c6", True, 2),
             Ev("case.failed", "c6", {"stage": "reflect", "reason": "reflection failed", "steps": []})]
    recs = {r.case_id: r for r in task_records(events + extra)}
    assert recs["c6"].completed and recs["c6"].success and not recs["c6"].invalid
    assert recs["c2"].tokens == 300 and recs["c2"].tool_calls == 1
    assert recs["c4"].timeout and not recs["c4"].invalid and recs["c5"].error and not recs["c5"].invalid


def test_no_cases_no_numbers():
    m = task_metrics([])
    assert m["n"] == 0 and all(m[k] is None for k in ("tc", "sr", "osr", "er", "qab", "tokens_per_correct_task"))


def test_metrics_in_the_summary_of_a_run_against_the_fake_server():
    cases = load_cases(EXAMPLES)[0][:4]
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        server.script = [("act", "garbage")] * 3  # the first case runs out of its 3 steps
        out = run(store, cases, openai_spec({"ddx-lookup": 0.9}), "r", live_options(server, max_steps=3))
        correct = [e.case_id for e in store.iter("r", types=["case.completed"]) if e.payload["correct"]]
        sim = run(store, cases, RunSpec(policy=EvoMedAgentPolicy(), backbone="sim", seed=0), "s", {})
    s = out.summary
    m = s["metrics"]
    assert m["n"] == 4 and m["tc"] == 75.0 and m["r_lim"] == 0.25 and m["r_inv"] == 0.0 and m["er"] == 0.75
    assert m["sr"] == pytest.approx(100 * s["accuracy"]) and correct
    per_case = {row["case_id"]: row["prompt_tokens"] + row["completion_tokens"] for row in s["llm"]["per_case"]}
    assert m["tokens_per_correct_task"] == pytest.approx(sum(per_case[c] for c in correct) / len(correct), abs=1e-3)
    assert m["q_sr"] is None and m["qab"] is None
    assert m["avg_turns"] >= 1 and m["avg_tool_calls"] > 0
    assert "metrics" not in sim.summary and "llm" not in sim.summary


def test_typed_terminations_osce_turns_and_per_task_t_min():
    def failed(cid, reason, termination=None, steps=()):
        p = {"stage": "act", "reason": reason, "steps": list(steps)}
        if termination:
            p["termination"] = termination
        return [Ev("case.failed", cid, p), Ev("case.completed", cid, {"index": 0, "correct": False})]

    dialogue = [{"kind": "tool", "content": "Do you smoke?"}, {"kind": "observation", "content": "Patient: no"},
                {"kind": "tool", "content": "REQUEST TEST: Chest_X-Ray"}, {"kind": "observation", "content": "x"},
                {"kind": "response", "content": "DIAGNOSIS READY: Pneumonia"}]
    events = [
        _case("a"), *failed("a", "reply is not an action", "invalid_action", _steps(1)),
        _case("b"), *failed("b", "no FINISH within 8 rounds", "turn_limit", _steps(8)),
        _case("c"), *failed("c", "model unavailable", "error"),
        _case("d"), Ev("answer.given", "d", {"answer": "Pneumonia", "source": "model", "steps": dialogue}),
        Ev("case.completed", "d", {"index": 0, "correct": True}),
        _case("e"), Ev("answer.given", "e", {"answer": "[]", "source": "llm:official", "steps": _steps(3, 2)}),
        Ev("feedback.recorded", "e", {"answer": "[]", "gold": "g", "correct": True, "min_rounds": 3}),
        Ev("case.completed", "e", {"index": 0, "correct": True}),
    ]
    recs = {r.case_id: r for r in task_records(events)}
    assert recs["a"].invalid and not recs["a"].timeout and recs["b"].timeout and recs["c"].error
    assert recs["d"].turns == 3  # two questions/tests and the diagnosis: OSCE turns are counted
    m = task_metrics(events, t_min=2)
    assert m["r_inv"] == 0.2 and m["r_lim"] == 0.2 and m["errors"] == 1 and m["er"] == 0.6
    assert recs["e"].t_min == 3 and m["osr"] == 20.0  # e: 3 turns = its own T_min (not the default 2)
