"""Answers that are the model's own: schema-decoded actions, truthful alignment of free text,
recorded answer sources, and learning from cases without an answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import EXAMPLES
from fake_openai_server import FakeOpenAI
from grandrounds.handlers.agent.actions import (mcq_action_schema, parse_schema_turn, probe_verdict)
from grandrounds.handlers.agent.guard import FINAL_NOTICE
from grandrounds.handlers.agent.protocol import (align_answer, concluded_option, explicit_statement, fallback_alignment,
                                                 parse_turn)
from grandrounds.handlers.agent.react import SYSTEM
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.eventstore import EventStore
from llm_helpers import MODEL, live_options, openai_spec, run

FIXTURE = Path(__file__).parent / "fixtures" / "local_model_replies.json"
OPTIONS = {"A": "Pulmonary embolism", "B": "Tension pneumothorax", "C": "Acute pericarditis",
           "D": "Cluster headache", "E": "Aortic dissection"}


@pytest.fixture(scope="module")
def cases():
    return load_cases(EXAMPLES)[0][:2]


# --- alignment of free text -------------------------------------------------------------------


def test_the_conclusion_wins_over_an_option_ruled_out_earlier():
    # align_answer's old rule took the longest option text anywhere: "Pulmonary embolism" (A)
    reply = ("Pulmonary embolism is unlikely with a clear film and no risk factors. The friction rub and diffuse "
             "ST elevation make this acute pericarditis.")
    assert fallback_alignment(reply, OPTIONS) == ("C", "conclusion")


def test_the_last_explicit_statement_wins_over_mentions_and_earlier_statements():
    reply = ("Answer: A at first sight, but the tracheal deviation and hypotension change it.\n"
             "Aortic dissection and pericarditis are less likely. [Response] B")
    assert explicit_statement(reply, OPTIONS) == "B"
    assert fallback_alignment(reply, OPTIONS) == ("B", "statement")
    assert fallback_alignment("The final answer is **E) Aortic dissection**.", OPTIONS) == ("E", "statement")


def test_several_options_without_a_conclusion_get_no_answer():
    reply = "It could be pulmonary embolism or aortic dissection; both fit the sudden pain."
    assert fallback_alignment(reply, OPTIONS) == (None, None)
    assert concluded_option("A) and E) both fit.", OPTIONS) is None
    assert align_answer("Pulmonary embolism or Aortic dissection", OPTIONS) is None
    # a longer option that contains a shorter one names only the longer
    opts = {"A": "Pneumonia", "B": "Aspiration pneumonia"}
    assert fallback_alignment("This is aspiration pneumonia.", opts) == ("B", "conclusion")


def test_prompts_show_no_placeholder_and_correctives_list_the_letters():
    assert "LETTER" not in SYSTEM and "LETTER" not in FINAL_NOTICE
    assert "<response>C</response>" in SYSTEM
    copied = parse_turn("<reasoning>r</reasoning><response>LETTER</response>", OPTIONS, [])
    assert copied.kind == "invalid" and "A, B, C, D, E" in copied.error and "<response>A</response>" in copied.error
    missing = parse_turn("I need to think more about this.", OPTIONS, [])
    assert missing.kind == "invalid" and "A, B, C, D, E" in missing.error


def test_untagged_replies_are_read_by_the_statement_then_the_conclusion():
    stated = parse_turn("The tracheal deviation settles it. [Response] B", OPTIONS, [])
    assert (stated.kind, stated.answer, stated.alignment) == ("response", "B", "statement")
    line = parse_turn("<B>Option C: Acute pericarditis</B>\n### Reasoning:\n1. **Pulmonary Embolism**: unlikely", OPTIONS, [])
    assert (line.kind, line.answer, line.alignment) == ("response", "C", "statement")  # a line that is one option
    concluded = parse_turn("The rub and the diffuse ST elevation point to acute pericarditis.", OPTIONS, [])
    assert (concluded.kind, concluded.answer, concluded.alignment) == ("response", "C", "conclusion")
    tagged = parse_turn("<reasoning>r</reasoning><response>C</response>", OPTIONS, [])
    assert tagged.alignment == "tag"


def test_recorded_real_replies_align_to_the_option_the_model_chose():
    """Replies of the local model (Qwen2.5-Coder-1.5B, temperature 0), recorded once with
    `benchmarks/bench_real_model.py --collect-replies`; `chosen` is the option each reply states
    or concludes with, read by a person."""
    data = json.loads(FIXTURE.read_text())
    assert data["replies"]
    for r in data["replies"]:
        letter, rule = fallback_alignment(r["reply"], r["options"])
        assert letter == r["chosen"], r["reply"]


# --- schema-decoded actions ---------------------------------------------------------------------


def test_the_action_schema_offers_only_the_moves_legal_at_this_step():
    with_tools = mcq_action_schema(["A", "B"], ["ddx"])
    moves = with_tools["properties"]["action"]["anyOf"]
    assert moves[0]["properties"]["answer"]["enum"] == ["A", "B"]
    assert moves[1]["properties"]["tool"]["enum"] == ["ddx"]
    final = mcq_action_schema(["A", "B"], [])
    assert final["properties"]["action"]["properties"]["answer"]["enum"] == ["A", "B"]
    assert list(with_tools["properties"]) == ["reasoning", "action"]  # reasoning is decoded first
    assert parse_schema_turn('{"reasoning": "r", "action": {"answer": "B"}}', ["A", "B"], []).answer == "B"
    assert parse_schema_turn('{"reasoning": "r", "action": {"tool": "ddx"}}', ["A", "B"], []).kind == "invalid"
    assert parse_schema_turn('{"reasoning": "r", "act', ["A", "B"], []).kind == "invalid"  # cut by max_tokens


def test_probe_verdicts():
    assert probe_verdict('{"word": "zebra-7"}', False) == "enforced"
    assert probe_verdict("Hello there!", False) == "not-enforced"
    assert probe_verdict(None, True) == "rejected"


def _schema_spec() -> RunSpec:
    return RunSpec(policy=EvoMedAgentPolicy(), backbone="openai", model=MODEL, seed=0,
                   actions={"mode": "schema", "json_schema": "enforced"})


def test_schema_runs_decode_every_turn_against_its_schema_and_record_the_mode(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        out = run(store, cases, _schema_spec(), "s", live_options(server))
        started = next(store.iter("s")).payload
        acts = [e.payload for e in store.iter("s", types=["llm.exchange"]) if e.payload["stage"] == "act"]
        answers = [e.payload for e in store.iter("s", types=["answer.given"])]
    assert started["actions"] == {"json_schema": "enforced", "mode": "schema"}
    assert acts and all(x["params"]["response_format"]["json_schema"]["name"] == "AgentTurn" for x in acts)
    assert "<response>" not in acts[0]["messages"][0]["content"]
    assert [a["source"] for a in answers] == ["llm:schema"] * len(cases)
    assert out.summary["metrics"]["answer_sources"] == {"llm:schema": len(cases)}


def test_text_runs_record_no_actions_field_so_old_runs_keep_their_bytes(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        run(store, cases[:1], openai_spec(), "t", live_options(server))
        started = next(store.iter("t")).payload
    assert "actions" not in started


def test_cli_probes_the_server_once_and_records_the_verdict(tmp_path):
    from click.testing import CliRunner

    from grandrounds.cli import main

    for supported, mode, verdict in ((True, "schema", "enforced"), (False, "text", "rejected")):
        db = tmp_path / f"{mode}.duckdb"
        with FakeOpenAI(schema_supported=supported) as server:
            res = CliRunner().invoke(main, ["run", str(EXAMPLES), "--db", str(db), "--backbone", "openai",
                                            "--model", MODEL, "--base-url", server.base_url, "--policy", "none",
                                            "--json"], env={"OPENAI_API_KEY": "k"}, catch_exceptions=False)
            probes = [r for r in server.requests if (r.get("response_format") or {}).get("json_schema", {})
                      .get("name") == "Probe"]
        assert res.exit_code == 0, res.output
        with EventStore(str(db), read_only=True) as store:
            rid = json.loads(res.output)["run_id"]
            started = next(store.iter(rid)).payload
        assert len(probes) == 1 and started["actions"] == {"json_schema": verdict, "mode": mode}


# --- failures of model behaviour and of reflection ----------------------------------------------


def test_a_reflection_that_cannot_be_obtained_leaves_the_graded_case_answered(cases):
    with FakeOpenAI() as server, EventStore(":memory:") as store:
        server.script = [("reflect", "bad_reflection")] * 2
        out = run(store, cases[:1], openai_spec(), "r", live_options(server))
        completed = [e.payload for e in store.iter("r", types=["case.completed"])]
    assert out.summary["failed"] == 0 and out.summary["reflections_failed"] == 1
    assert out.summary["metrics"]["tc"] == 100.0
    assert completed[0]["correct"] == (out.summary["correct"] == 1)


def test_a_case_whose_reflection_failed_is_still_an_episode_with_no_lesson(cases):
    """Its findings and confirmed answer are known without the model: a later case of the same
    presentation can meet it as a precedent. Runs recorded before `episode_without_reflection` lack
    the field and re-execute without the episode."""
    for flag, episodes in ((True, 1), (False, 0)):
        policy = EvoMedAgentPolicy(episode_without_reflection=flag)
        with FakeOpenAI() as server, EventStore(":memory:") as store:
            server.script = [("reflect", "bad_reflection")] * 2
            spec = RunSpec(policy=policy, backbone="openai", model=MODEL, seed=0, tools={})
            out = run(store, cases[:1], spec, "r", live_options(server))
            stored = [e.payload for e in store.iter("r", types=["episode.stored"])]
            failed = [e for e in store.iter("r", types=["case.failed"])]
        assert out.summary["reflections_failed"] == 1 and len(failed) == 1
        assert len(stored) == episodes
        if stored:
            assert stored[0]["summary"] == "" and stored[0]["guideline"] == ""
            assert stored[0]["gold"] == cases[0].answer and stored[0]["case_id"] == cases[0].case_id
