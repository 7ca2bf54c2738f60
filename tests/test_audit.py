"""`grandrounds audit`: time travel, item history, per-case explanation and run diff, on sim runs
where memory demonstrably changes later answers (the `teach` stream of replay_fixtures)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from click.testing import CliRunner

from grandrounds.app import run_cases
from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.runs import RunSpec
from grandrounds.replay.audit_history import history
from replay_fixtures import recorded_db, teaching_cases  # noqa: F401
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore
from grandrounds.store.projection import rebuild

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cases.jsonl"


def _audit(db, *args):
    res = CliRunner().invoke(main, ["audit", *args, "--db", str(db), "--json"])
    return res, (json.loads(res.stdout) if res.stdout.strip() else None)


def test_explain_shows_the_rule_and_the_case_it_came_from(recorded_db):
    res, out = _audit(recorded_db, "explain", "teach", "learn-1")
    assert res.exit_code == 0, res.output
    assert out["case_index"] == 2 and out["answer"] == "A" and out["correct"] is True
    assert out["followed"]["kind"] == "rule" and out["followed"]["id"] == "rule-00000"
    assert out["followed"]["from_case_id"] == "teach-1" and out["followed"]["from_case_index"] == 0
    assert "unequal arm blood pressures" in out["followed"]["from_case_question"]
    rule = next(r for r in out["retrieved"]["rules"] if r["rule_id"] == "rule-00000")
    assert rule["from_case_id"] == "teach-1" and rule["text"] in out["injected_prefix"]
    assert {"relevance", "utility", "score", "rank", "priority"} <= set(rule)
    assert any("rule:rule-00000" in s["content"] for s in out["steps"])
    assert out["feedback"]["correct"] and {"rule_id": "rule-00000", "helpful": True} in out["feedback"]["rule_outcomes"]
    assert [c["type"] for c in out["memory_changes"]] == ["episode.stored"]
    # The same stream without memory answers this case differently, and wrongly.
    _, none = _audit(recorded_db, "explain", "teach-none", "learn-1")
    assert none["answer"] != out["answer"] and none["correct"] is False and none["answer_source"] == "lexical"
    assert none["retrieved"]["rules"] == [] and none["memory_changes"] == []
    # by index, and in human form
    assert _audit(recorded_db, "explain", "teach", "#2")[1]["case_id"] == "learn-1"
    human = CliRunner().invoke(main, ["audit", "explain", "teach", "learn-1", "--db", str(recorded_db)])
    assert "learned from case teach-1 (#0" in human.output and "memory changes" in human.output


def test_explain_lists_the_memory_changes_a_case_caused(recorded_db):
    _, out = _audit(recorded_db, "explain", "teach", "kd-3")
    kinds = [c["type"] for c in out["memory_changes"]]
    assert kinds == ["episode.stored", "rule.priority_changed", "rule.added"]
    change = out["memory_changes"][1]["payload"]
    assert change["rule_id"] == "rule-00001" and (change["old"], change["new"]) == (0, 1)
    assert out["followed"]["id"] == "rule-00001" and out["correct"] is False
    assert out["reflection"]["edits"][0]["op"] == "reprioritise"


def test_history_of_a_rule_from_creation_to_retirement(recorded_db):
    res, out = _audit(recorded_db, "history", "teach", "rule-00001")
    assert res.exit_code == 0, res.output
    life = [(e["event"], e["case_id"]) for e in out["events"]
            if e["event"] in ("created", "patched", "demoted", "retired", "merged")]
    assert life == [("created", "kd-1"), ("patched", "kd-2"), ("demoted", "kd-3"), ("demoted", "kd-4"),
                    ("retired", "kd-5")]
    created = out["events"][0]
    assert "Kawasaki disease" in created["text"] and created["reflection_seq"] is not None
    with EventStore(recorded_db, read_only=True) as store:
        refl = store.read("teach", upto_seq=created["reflection_seq"])[-1]
        assert refl.type == "reflection.recorded" and refl.case_id == "kd-1"
    patched = next(e for e in out["events"] if e["event"] == "patched")
    assert "Kawasaki" in patched["old_text"] and "Toxic shock syndrome" in patched["text"]
    uses = [e for e in out["events"] if e["event"] == "retrieved"]
    assert [u["case_id"] for u in uses if u["followed"]] == ["kd-2", "kd-3", "kd-4", "kd-5"]
    assert all(u["correct"] is False for u in uses if u["followed"])
    # utility over time: one point per feedback on the rule, by the Evo-MedAgent formula
    cfg = EvoMedAgentPolicy()
    first = out["utility"][0]
    # first shown to kd-2, case #3 (the relevance floor keeps it from the unrelated learn-1 before it),
    # which it misled: N = 4 feedbacks so far, n = 1 selection, 0 helpful
    assert first["case_index"] == 3 and first["selected"] == 1 and first["helpful"] == 0
    assert math.isclose(first["utility"], 0.0 + cfg.exploration_c * math.sqrt(math.log(4 + 1) / 2), abs_tol=1e-6)
    assert len(out["utility"]) == sum(e["event"] == "feedback" for e in out["events"])
    assert out["summary"]["status"] == "retired"
    _, items = _audit(recorded_db, "items", "teach", "--kind", "rule", "--status", "retired")
    assert [i["id"] for i in items["items"]] == ["rule-00001"]
    assert items["items"][0]["utility"] == out["summary"]["utility_now"]
    human = CliRunner().invoke(main, ["audit", "history", "teach", "rule-00001", "--db", str(recorded_db)])
    assert "retired by case #6 kd-5" in human.output and "utility over time" in human.output


def test_history_shows_merges_episodes_and_tools(recorded_db, tmp_path):
    # Without the relevance floors (the paper's retrieval, preset ablation `no-floors`) the example
    # stream proposes a near-duplicate rule, which escalates the existing one: a merge in its history.
    merges_db = tmp_path / "merges.duckdb"
    with EventStore(merges_db) as store:
        spec = RunSpec(policy=EvoMedAgentPolicy(rule_floor=0.0, episode_floor=-1.0))
        run_cases(store, load_cases(EXAMPLES)[0][:40], spec, run_id="src",
                  cache=EmbeddingCache(shared_minilm(), store.conn))
        merge = next(e for e in store.read("src", types=["rule.priority_changed"])
                     if e.payload["reason"].startswith("near-duplicate"))
    _, out = _audit(merges_db, "history", "src", merge.payload["rule_id"])
    merged = [e for e in out["events"] if e["event"] == "merged"]
    assert merged and merged[0]["seq"] == merge.seq and merged[0]["case_id"] == merge.case_id
    assert out["summary"]["merges"] >= 1

    _, ep = _audit(recorded_db, "history", "teach", "ep-00000")
    assert ep["kind"] == "episode" and ep["events"][0]["event"] == "created"
    assert ep["events"][0]["case_id"] == "teach-1" and ep["summary"]["retrieved"] >= 1

    # tools: a run offering one simulated tool
    with EventStore(tmp_path / "tools.duckdb") as store:
        spec = RunSpec(policy=EvoMedAgentPolicy(), tools={"ddx": 0.95})
        run_cases(store, teaching_cases(), spec, run_id="tools", cache=EmbeddingCache(shared_minilm(), store.conn))
        t = history(store, "tools", "ddx")
        calls = store.read("tools", types=["answer.given"])
    assert t["kind"] == "tool" and t["summary"]["calls"] == len(calls) == 7
    assert sum(t["summary"]["outcomes"].values()) == 7 and t["summary"]["label_now"] == "Trusted"
    assert [e["event"] for e in t["events"]].count("relabelled") == 1


def test_items_time_travel_matches_a_rebuild_of_the_log(recorded_db):
    # the teach stream: rule-00001 as it was at each point
    def rule1(case: int):
        _, out = _audit(recorded_db, "items", "teach", "--as-of-case", str(case), "--kind", "rule")
        return {i["id"]: i for i in out["items"]}.get("rule-00001")

    assert rule1(0) is None
    assert "Kawasaki disease" in rule1(1)["text"] and rule1(1)["priority"] == 0
    assert "Toxic shock syndrome" in rule1(3)["text"]
    assert rule1(4)["priority"] == 1 and rule1(5)["priority"] == 2 and rule1(5)["status"] == "active"
    assert rule1(6)["status"] == "retired"

    # a point in the middle of the 40-case run equals the projection rebuilt up to that seq
    res, out = _audit(recorded_db, "items", "src", "--as-of-case", "19")
    assert res.exit_code == 0 and out["as_of"]["cases_completed"] == 20 and not out["as_of"]["at_head"]
    seq = out["as_of"]["seq"]
    with EventStore(recorded_db, read_only=True) as store:
        assert store.read("src", upto_seq=seq)[-1].type == "case.completed"
        state = rebuild(store, "src", EmbeddingCache(shared_minilm(), None), upto_seq=seq).state.policy_memory
    from grandrounds.handlers.policies.evo_medagent.policy import rule_utility

    rules = {i["id"]: i for i in out["items"] if i["kind"] == "rule"}
    assert set(rules) == set(state.rules)
    for rid, r in state.rules.items():
        assert (rules[rid]["status"], rules[rid]["priority"], rules[rid]["selected"]) == (r.status, r.priority, r.selected)
        assert rules[rid]["utility"] == round(rule_utility(r, state.feedback_count, EvoMedAgentPolicy()), 6)
    assert {i["id"] for i in out["items"] if i["kind"] == "episode"} == set(state.episodes)
    assert out["counts"]["episodes"] == 20
    by_seq = _audit(recorded_db, "items", "src", "--as-of-seq", str(seq))[1]
    assert by_seq["items"] == out["items"]
    human = CliRunner().invoke(main, ["audit", "items", "src", "--as-of-case", "19", "--limit", "10",
                                      "--db", str(recorded_db)])
    assert "after case #19" in human.output and "more (--limit 0 shows all)" in human.output


def test_diff_of_two_runs_summary_first(recorded_db):
    res, out = _audit(recorded_db, "diff", "teach", "teach-none")
    assert res.exit_code == 0, res.output
    assert out["summary"]["rules"] == {"only_a": 5, "only_b": 0, "changed": 0, "same": 0}
    assert out["summary"]["episodes"]["only_a"] == 7 and not out["identical"]
    assert {r["a"]["id"] for r in out["rules"]["only_a"]} == {f"rule-0000{i}" for i in range(5)}
    same = _audit(recorded_db, "diff", "teach", "teach")[1]
    assert same["identical"] and same["summary"]["rules"]["same"] == 5 and same["summary"]["rules"]["changed"] == 0
    human = CliRunner().invoke(main, ["audit", "diff", "teach", "teach-none", "--db", str(recorded_db)])
    lines = human.output.splitlines()
    assert lines[0].startswith("diff teach (a) vs teach-none (b)") and lines[4].split()[:5] == ["rules", "5", "0", "0", "0"]


def test_diff_of_two_orders_matches_rules_by_content(recorded_db, tmp_path):
    with EventStore(tmp_path / "orders.duckdb") as store:
        cache = EmbeddingCache(shared_minilm(), store.conn)
        cases = teaching_cases()
        run_cases(store, cases, RunSpec(policy=EvoMedAgentPolicy()), run_id="fwd", cache=cache)
        run_cases(store, cases[::-1], RunSpec(policy=EvoMedAgentPolicy()), run_id="rev", cache=cache)
    _, out = _audit(tmp_path / "orders.duckdb", "diff", "fwd", "rev")
    s = out["summary"]["rules"]
    assert s["only_a"] + s["changed"] + s["same"] == out["runs"]["a"]["rules_active"] + sum(
        1 for r in out["rules"]["only_a"] + out["rules"]["changed"] if r.get("a", {}).get("status") == "retired")
    assert out["summary"]["episodes"] == {"only_a": 0, "only_b": 0, "changed": out["summary"]["episodes"]["changed"],
                                          "same": 7 - out["summary"]["episodes"]["changed"]}
    for c in out["rules"]["changed"]:
        assert c["a"]["id"] and c["b"]["id"] and set(c["fields"]) <= {"status", "utility"}


def test_audit_bad_input_exits_2(recorded_db):
    for args, message in [
        (["items", "ghost"], "no run 'ghost'"),
        (["items", "teach", "--as-of-case", "99"], "no completed case with index 99"),
        (["items", "teach", "--as-of-seq", "-1"], "outside run"),
        (["items", "teach", "--as-of-case", "1", "--as-of-seq", "3"], "not both"),
        (["history", "teach", "rule-99999"], "no memory item 'rule-99999'"),
        (["explain", "teach", "no-such-case"], "received no case 'no-such-case'"),
        (["diff", "teach", "ghost"], "no run 'ghost'"),
    ]:
        res, out = _audit(recorded_db, *args)
        assert res.exit_code == 2, (args, res.output)
        assert message in out["error"], (args, out)
