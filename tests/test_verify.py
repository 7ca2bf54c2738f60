"""`grandrounds verify`: re-execution from a run's own log, divergence naming, tamper evidence."""

from __future__ import annotations

import json

import duckdb
from click.testing import CliRunner

from grandrounds.handlers.policies.evo_medagent import policy as retrieve  # the module that rounds retrieval scores
from grandrounds.cli import main
from grandrounds.replay.verify import compare_logs, first_difference
from replay_fixtures import db_copy, recorded_db  # noqa: F401
from grandrounds.store.eventstore import EventStore


def _verify(db, run_id: str):
    res = CliRunner().invoke(main, ["verify", "--db", str(db), run_id, "--json"])
    return res, json.loads(res.stdout)


def test_a_recorded_run_re_executes_to_the_same_fingerprint(db_copy):
    for run_id in ("src", "teach-none"):
        res, out = _verify(db_copy, run_id)
        assert res.exit_code == 0, res.output
        assert out["identical"] and out["chain_intact"] and out["ok"]
        assert out["fingerprint"] == out["replayed_fingerprint"]
        with EventStore(db_copy, read_only=True) as store:
            assert out["fingerprint"] == store.fingerprint(run_id)
        assert out["first_divergence"] is None and out["complete"]
    human = CliRunner().invoke(main, ["verify", "--db", str(db_copy), "src"])
    assert human.exit_code == 0 and "IDENTICAL" in human.output


def _changes_at_5_decimals(payload: dict) -> bool:
    scores = [r[k] for r in payload["rules"] for k in ("relevance", "utility", "score")]
    scores += [e["relevance"] for e in payload["episodes"]]
    return any(round(x, 5) != x for x in scores)


def test_a_perturbed_handler_is_reported_at_the_first_differing_event(db_copy, monkeypatch):
    with EventStore(db_copy, read_only=True) as store:
        expected = next(e for e in store.read("src", types=["memory.retrieved"]) if _changes_at_5_decimals(e.payload))
    # The retrieve stage now rounds scores to 5 decimals instead of 6.
    monkeypatch.setattr(retrieve, "_r6", lambda x: round(float(x), 5))
    res, out = _verify(db_copy, "src")
    assert res.exit_code == 1
    assert not out["identical"] and out["chain_intact"]  # the log is intact: the code changed
    assert out["fingerprint"] != out["replayed_fingerprint"]
    d = out["first_divergence"]
    assert d["seq"] == expected.seq and d["case_id"] == expected.case_id
    assert d["recorded_type"] == d["replayed_type"] == "memory.retrieved"
    assert d["path"].startswith(("payload.rules[", "payload.episodes["))
    assert d["replayed"] != d["recorded"] and abs(d["replayed"] - d["recorded"]) <= 1e-5
    human = CliRunner().invoke(main, ["verify", "--db", str(db_copy), "src"])
    assert human.exit_code == 1 and f"first divergence at seq {expected.seq}" in human.output


def test_an_event_edited_outside_the_api_breaks_the_chain(db_copy):
    with EventStore(db_copy, read_only=True) as store:
        target = store.read("teach", types=["feedback.recorded"])[2]
    forged = dict(target.payload, correct=not target.payload["correct"])
    con = duckdb.connect(str(db_copy))
    con.execute("UPDATE events SET payload = ? WHERE run_id = 'teach' AND seq = ?", [json.dumps(forged), target.seq])
    con.close()
    res, out = _verify(db_copy, "teach")
    assert res.exit_code == 1
    assert not out["chain_intact"] and out["chain_break_seq"] == target.seq
    assert out["first_divergence"]["seq"] == target.seq
    assert out["first_divergence"]["path"] == "payload.correct"
    human = CliRunner().invoke(main, ["verify", "--db", str(db_copy), "teach"])
    assert "BROKEN at seq" in human.output
    # other runs in the same file are untouched
    assert _verify(db_copy, "teach-none")[1]["ok"]


def test_a_log_that_ends_early_or_runs_long_names_where(recorded_db):
    with EventStore(recorded_db, read_only=True) as store:
        events = store.read("teach")
    d = compare_logs(events, events[:-3])
    assert d.seq == events[-3].seq and d.path == "end of log" and d.replayed_type is None
    assert compare_logs(events, events) is None
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == ("payload.a[1].b", 2, 3)


def test_verify_bad_input(db_copy, tmp_path):
    res, out = _verify(db_copy, "missing-run")
    assert res.exit_code == 2 and "no run 'missing-run'" in out["error"]
    res = CliRunner().invoke(main, ["verify", "--db", str(tmp_path / "none.duckdb"), "src", "--json"])
    assert res.exit_code == 2
