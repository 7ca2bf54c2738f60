"""The read model (store/read_model.py): typed queries, one row decoder, upcasters applied; readers above
the store hold no SQL over the events table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import run_in
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def log(example_cases):
    from grandrounds.handlers.policies.config import EvoMedAgentPolicy
    from grandrounds.handlers.runs import RunSpec

    store = EventStore(":memory:")
    run_in(store, example_cases[:8], RunSpec(policy=EvoMedAgentPolicy(), seed=0))
    return EventLog(store)


def test_queries_by_range_type_case_and_counts(log):
    everything = list(log.events("r"))
    assert [e.seq for e in everything] == list(range(len(everything))) == list(range(log.count("r")))
    assert [e.seq for e in log.events("r", after_seq=3, upto_seq=6)] == [4, 5, 6]
    completed = log.of_type("r", "case.completed")
    assert len(completed) == log.completed_cases("r") == 8 == log.counts_by_type("r")["case.completed"]
    assert log.latest("r", "case.completed").seq == completed[-1].seq
    assert log.latest("r", "case.completed", upto_seq=completed[2].seq).seq == completed[2].seq
    assert log.first("r", "run.started").seq == 0
    # as of a case: the seq of its case.completed; case ids <-> indexes from case.received
    assert log.seq_after_case("r", 2) == completed[2].seq and log.seq_after_case("r", 99) is None
    indexes = log.case_indexes("r")
    cid = next(c for c, i in indexes.items() if i == 3)
    of_case = log.of_case("r", cid)
    assert {e.case_id for e in of_case} == {cid} and of_case[-1].type == "case.completed"
    assert log.completed_cases("r", upto_seq=completed[2].seq) == 3
    # typed payloads, meta apart (and left out on request)
    assert log.first("r", "run.started").model().policy_name == "evo-medagent"
    assert all(e.meta == {} for e in log.events("r", meta=False))
    assert log.same_events("r", "r") and not log.same_events("r", "nothing")


def test_payloads_are_upcast_on_read():
    store = EventStore(":memory:")
    v1 = {"answer": "A", "gold": "B", "correct": False, "rule_outcomes": [],
          "tool_outcomes": [{"tool": "lab", "helpful": False, "harmful": True}]}
    store.conn.execute("INSERT INTO events VALUES ('old', 0, 'feedback.recorded', 1, 'c1', NULL, ?, '{}', 'x')",
                       [json.dumps(v1)])
    e, = EventLog(store).events("old")
    assert e.payload["tool_outcomes"] == [{"tool": "lab", "outcome": "harmful"}]  # v1 -> v2
    assert e.model().tool_outcomes[0].outcome == "harmful"


SQL_OVER_EVENTS = re.compile(r"\b(FROM|JOIN|INTO|UPDATE)\s+events\b", re.IGNORECASE)


def test_no_sql_over_the_events_table_above_the_store():
    """replay/, the CLI (grandrounds/) and the benchmarks read events through the read model."""
    found = []
    for top in ("replay", "grandrounds", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if SQL_OVER_EVENTS.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []
