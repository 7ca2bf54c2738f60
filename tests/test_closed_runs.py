"""A complete run is closed (issue 43, part 3).

Before: a namespace opened with `cases=2` took a third case after `run.completed`, and `verify` then said
"VERIFIED (IDENTICAL) … cases 3 · all 2 declared cases completed"; `cases=-5` was accepted. Now no case
enters a run after its last declared one (or after `run.completed`), a declared count is a positive whole
number, and `verify` never prints a contradiction: each inconsistent record an older build (or an edit)
can leave is reported INCONSISTENT, never whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from cli_helpers import cli_json
from grandrounds import Memory
from grandrounds.cli import main
from grandrounds.handlers.runs import DeclaredCount
from grandrounds.store.canonical import canonical_json
from grandrounds.store.memory_state import MemoryState, RunClosed
from hostile_rows import Hostile
from test_tamper import _rechain

ROOT = Path(__file__).resolve().parents[1]
CASES = [json.loads(line) for line in (ROOT / "examples" / "cases.jsonl").read_text().splitlines()[:3]]
COUNTS = [0, -5, True, 2.5, "2"]
CONTRADICTIONS = {  # id -> (the declared count re-chained into run.started, what verify says)
    "negative": (-5, "declares -5 cases, not a positive count"),
    "zero": (0, "declares 0 cases, not a positive count"),
    "fewer-than-received": (1, "2 cases received where run.started declares 1"),
}
T = "tests/test_closed_runs.py::"
HOSTILE = {  # the rows of docs/trust.md's hostile matrix these tests assert
    "complete": Hostile(
        "a case offered to a complete run (a namespace of `cases=2`, a third `recall`; the run reopened)",
        T + "test_no_case_enters_a_complete_namespace",
        'taken in, then "VERIFIED (IDENTICAL) … cases 3 · all 2 declared cases completed"',
        raises="RunClosed", says=("is complete", "ex-003"), written=False, codes=()),
    "count": Hostile(
        "a declared count of " + ", ".join(f"`{c!r}`" for c in COUNTS),
        T + "test_a_declared_count_is_a_positive_whole_number", "accepted",
        raises="DeclaredCount", says=("positive whole number",), written=False),
    "after-completed": Hostile(
        "an older build's log: a case after `run.completed`",
        T + "test_a_case_after_run_completed_is_inconsistent_never_whole", "VERIFIED (IDENTICAL)",
        exit=1, says=("3 cases received where run.started declares 2", "a case received after run.completed",
                      "INCONSISTENT"), codes=("inconsistent", "diverged")),
    "declared-edited": Hostile(
        "`run.started.cases` rewritten to " + ", ".join(str(v) for v, _ in CONTRADICTIONS.values())
        + " (fewer than received), re-chained",
        T + "test_each_contradiction_of_the_declared_count_is_named", "—",
        exit=1, says=tuple(says for _, says in CONTRADICTIONS.values()), codes=("inconsistent", "diverged")),
    "two-completed": Hostile(
        "two `run.completed` events, re-chained", T + "test_two_run_completed_events_are_inconsistent",
        "—", exit=1, says=("2 run.completed events",), codes=("inconsistent", "diverged")),
}


def _answer(memory, case) -> None:
    memory.recall(case)
    memory.record(case["case_id"], answer="A")
    memory.feedback(case["case_id"], outcome=case["answer"])


def _verify(db: Path, run_id: str) -> dict:
    code, out = cli_json("verify", "--db", db, run_id)
    return {"code": code, **out}


def test_no_case_enters_a_complete_namespace(tmp_path):
    db = tmp_path / "m.duckdb"
    with Memory.open(db, namespace="ward-7", cases=2) as memory:
        _answer(memory, CASES[0])
        _answer(memory, CASES[1])
        with pytest.raises(RunClosed) as refused:
            memory.recall(CASES[2])
    row = HOSTILE["complete"]
    assert type(refused.value).__name__ == row.raises and row.said(str(refused.value)), refused.value
    with Memory.open(db, namespace="ward-7", cases=2) as memory:  # reopened: still closed
        with pytest.raises(RunClosed):
            memory.recall(CASES[2])
    out = _verify(db, "ward-7")
    assert out["code"] == 0 and out["identical"] and out["cases"] == 2 and out["declared_cases"] == 2, out
    assert tuple(out["reason_codes"]) == row.codes, out
    assert row.written is False and out["cases"] == 2  # nothing of the third case was written


@pytest.mark.parametrize("cases", COUNTS)
def test_a_declared_count_is_a_positive_whole_number(tmp_path, cases):
    db, row = tmp_path / "m.duckdb", HOSTILE["count"]
    with pytest.raises(DeclaredCount) as refused:
        Memory.open(db, namespace="w", cases=cases)
    assert type(refused.value).__name__ == row.raises and row.said(str(refused.value)), refused.value
    assert row.written is False and not db.exists() and not Path(f"{db}.keys").exists()  # bad input


def _old_build_log(tmp_path, monkeypatch) -> Path:
    """What the build before this one wrote: a run of 2 declared cases that took a third after run.completed."""
    db = tmp_path / "old.duckdb"
    with monkeypatch.context() as m:
        m.setattr(MemoryState, "check_open", lambda self, run_id, case_id: None)
        with Memory.open(db, namespace="ward-7", cases=2) as memory:
            for case in CASES:
                _answer(memory, case)
    return db


def _edit(db: Path, sql: str, params: list) -> None:
    con = duckdb.connect(str(db))
    try:
        con.execute(sql, params)
        _rechain(con, "ward-7")  # consistent chain: only the completeness check can see it
    finally:
        con.close()


def _set_declared(value):
    def edit(db: Path) -> None:
        con = duckdb.connect(str(db))
        try:
            started = json.loads(con.execute("SELECT payload FROM events WHERE run_id = 'ward-7' AND seq = 0")
                                 .fetchone()[0])
        finally:
            con.close()
        _edit(db, "UPDATE events SET payload = ? WHERE run_id = 'ward-7' AND seq = 0",
              [canonical_json(dict(started, cases=value))])
    return edit


def test_a_case_after_run_completed_is_inconsistent_never_whole(tmp_path, monkeypatch):
    db = _old_build_log(tmp_path, monkeypatch)
    out, row = _verify(db, "ward-7"), HOSTILE["after-completed"]
    assert out["code"] == row.exit and not out["ok"] and not out["identical"] and out["complete"] is False, out
    assert tuple(out["reason_codes"]) == row.codes, out
    human = CliRunner().invoke(main, ["verify", "--db", str(db), "ward-7"]).output
    assert row.said(out["completeness"] + " " + human), (out, human)
    assert "all 2 declared cases completed" not in human, human


@pytest.mark.parametrize("declared,says", CONTRADICTIONS.values(), ids=CONTRADICTIONS)
def test_each_contradiction_of_the_declared_count_is_named(tmp_path, declared, says):
    db = tmp_path / "m.duckdb"
    with Memory.open(db, namespace="ward-7", cases=2) as memory:
        _answer(memory, CASES[0])
        _answer(memory, CASES[1])
    _set_declared(declared)(db)
    out, row = _verify(db, "ward-7"), HOSTILE["declared-edited"]
    assert out["code"] == row.exit and out["complete"] is False and tuple(out["reason_codes"]) == row.codes, out
    assert says in row.says and says in out["completeness"], out
    assert "all " not in out["completeness"], out


def test_two_run_completed_events_are_inconsistent(tmp_path):
    db = tmp_path / "m.duckdb"
    with Memory.open(db, namespace="ward-7", cases=2) as memory:
        _answer(memory, CASES[0])
        _answer(memory, CASES[1])
    con = duckdb.connect(str(db))
    try:
        row = con.execute("SELECT seq, type, schema_version, case_id, causation_seq, payload, meta FROM events "
                          "WHERE run_id = 'ward-7' AND type = 'run.completed'").fetchone()
        last = con.execute("SELECT max(seq) FROM events WHERE run_id = 'ward-7'").fetchone()[0]
        con.execute("INSERT INTO events VALUES ('ward-7', ?, ?, ?, ?, ?, ?, ?, 'x')", [last + 1, *row[1:]])
        _rechain(con, "ward-7")
    finally:
        con.close()
    out, row = _verify(db, "ward-7"), HOSTILE["two-completed"]
    assert out["code"] == row.exit and row.said(out["completeness"]), out
    assert tuple(out["reason_codes"]) == row.codes, out
