"""RetroSum's retrospection as the paper and its published code run it (issue 44, part 4): under the
preset's defaults an agent that uses its step budget writes summaries (after steps 3 and 6, and once
more when the episode ends, for reflection); the summariser reads its previous summary; the
`retrospect_context` ablation takes the look-back from the actor or from the summariser; runs
recorded before it (no `summary_every` in their policy) keep the agent loop's own summariser."""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES
from fake_openai_server import FakeOpenAI
from grandrounds.handlers.agent.guard import SUMMARY_HEADER
from grandrounds.handlers.agent.retrosum import RECENT_HEADER
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import load_policy, policy_from_dict, policy_to_dict
from grandrounds.handlers.policies.retrosum.lessons import SYSTEM as LESSON_SYSTEM
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.eventstore import EventStore
from llm_helpers import MODEL, live_options, run

# Six broken turns use the default budget of 7 steps; step 7 answers by lexical overlap.
BROKEN = [("act", "bad_json_tool"), ("act", "unknown_tool"), ("act", "no_action"), ("act", "no_action"),
          ("act", "bad_json_tool"), ("act", "unknown_tool")]


class LessonServer(FakeOpenAI):
    """The fake server, also playing RetroSum's lesson writer."""

    def _text(self, kind, messages, action):
        if messages[0]["content"].startswith(LESSON_SYSTEM[:40]):
            return json.dumps({"actor_lessons": [{"text": "Weigh every finding.", "trigger": ["fever"]}],
                               "summariser_lessons": [{"text": "Keep the exact values."}]})
        return super()._text(kind, messages, action)


@pytest.fixture(scope="module")
def case():
    return load_cases(EXAMPLES)[0][0]


def _run(tmp_path, case, policy, run_id="r"):
    spec = RunSpec(policy=policy, backbone="openai", model=MODEL, seed=0)
    with LessonServer() as server, EventStore(tmp_path / f"{run_id}.duckdb") as store:
        server.script = list(BROKEN)
        out = run(store, [case], spec, run_id, live_options(server))  # the agent's defaults: 7 steps
        exchanges = {e.payload["purpose"]: e.payload for e in store.iter(run_id, types=["llm.exchange"])
                     if e.payload["stage"] == "act"}
        answer = next(store.iter(run_id, types=["answer.given"])).payload
        reflected = [e.payload for e in store.iter(run_id, types=["llm.exchange"]) if e.payload["stage"] == "reflect"]
    assert out.summary["failed"] == 0
    return exchanges, answer, reflected


def _prompt(exchange) -> str:
    return exchange["messages"][-1]["content"]


def test_the_preset_records_summaries_when_the_agent_uses_its_budget(tmp_path, case):
    exchanges, answer, reflected = _run(tmp_path, case, load_policy("retrosum"))
    assert [p for p in exchanges if p.startswith("summarise")] == ["summarise-step-3", "summarise-step-6",
                                                                    "summarise-final"]
    kinds = [s["kind"] for s in answer["steps"]]
    assert kinds.count("summary") == 3 and kinds[-2:] == ["response", "summary"]  # the end summary follows the answer
    summaries = [s["content"] for s in answer["steps"] if s["kind"] == "summary"]
    assert summaries[-1] == exchanges["summarise-final"]["response"].strip()
    # the summariser reads its previous summary and the whole raw history
    six = _prompt(exchanges["summarise-step-6"])
    assert f"## Previous summary (written after step 3)\n{summaries[0]}" in six and "## Full history (steps 1-6)" in six
    assert "## Previous summary" not in _prompt(exchanges["summarise-step-3"])
    final = _prompt(exchanges["summarise-final"])
    assert "The episode has ended" in final and "### Step 7" in final and "the episode ended: answer" in final
    # reflection reads the end-of-episode summary as the trajectory's latest
    assert reflected and f"## Latest retrospective summary\n{summaries[-1]}" in _prompt(reflected[0])
    # the actor keeps the raw history and sees the latest summary under the complete-history header
    five = _prompt(exchanges["react-step-5"])
    assert SUMMARY_HEADER.format(step=3) in five
    first = exchanges["react-step-1"]["response"]
    assert any(first == m["content"] for m in exchanges["react-step-5"]["messages"])


def test_the_summariser_only_ablation_shows_the_actor_the_turns_after_the_summary(tmp_path, case):
    policy = load_policy("retrosum").model_copy(update={"retrospect_context": "summariser"})
    exchanges, _, _ = _run(tmp_path, case, policy)
    step5 = exchanges["react-step-5"]["messages"]
    first, fourth = exchanges["react-step-1"]["response"], exchanges["react-step-4"]["response"]
    assert not any(first == m["content"] for m in step5) and any(fourth == m["content"] for m in step5)
    assert RECENT_HEADER.format(step=3) in _prompt(exchanges["react-step-5"])
    assert "## Full history (steps 1-6)" in _prompt(exchanges["summarise-step-6"])  # it still re-reads everything


def test_the_actor_only_ablation_summarises_the_recent_steps_on_the_previous_summary(tmp_path, case):
    policy = load_policy("retrosum").model_copy(update={"retrospect_context": "actor"})
    exchanges, _, _ = _run(tmp_path, case, policy)
    six = _prompt(exchanges["summarise-step-6"])
    assert "## Recent history (steps 4-6)" in six and "### Step 3\n" not in six and "## Previous summary" in six
    first = exchanges["react-step-1"]["response"]
    assert any(first == m["content"] for m in exchanges["react-step-5"]["messages"])  # the actor keeps it all


def test_without_retrospection_no_summary_is_written(tmp_path, case):
    policy = load_policy("retrosum").model_copy(update={"summary_every": 0, "end_summary": False})
    exchanges, answer, _ = _run(tmp_path, case, policy)
    assert not [p for p in exchanges if p.startswith("summarise")]
    assert "summary" not in [s["kind"] for s in answer["steps"]]


def test_a_run_recorded_before_it_keeps_the_agent_loops_summariser(tmp_path, case):
    recorded = {k: v for k, v in policy_to_dict(load_policy("retrosum")).items()
                if k not in ("summary_every", "retrospect_context", "end_summary")}
    old = policy_from_dict(recorded, recorded=True)
    assert old.summary_every is None
    exchanges, answer, _ = _run(tmp_path, case, old)  # the agent's w = 10 never fires within 7 steps
    assert not [p for p in exchanges if p.startswith("summarise")]
