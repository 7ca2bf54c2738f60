"""What every audit query shares: input errors, case lookups, memory folded up to a seq.

Audit reads the log, never a live projection: the memory "as it was" at seq S is the fold
of the run's events up to S. Only the event types that change memory are read (SQL filters
out case payloads, retrieval prefixes and reflections), which keeps a fold of a
2,500-case run well under a second; the fold itself is `MemoryState.apply`, the one used
live, so audit cannot disagree with what the run saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from grandrounds.handlers.policies.config import EvoMedAgentPolicy, PolicyConfig
from grandrounds.handlers.policies.evo_medagent.policy import rule_utility
from grandrounds.replay.caselog import require_spec
from grandrounds.store.events import payload_class, upcast
from grandrounds.store.eventstore import EventStore
from grandrounds.store.memory_state import MemoryState, Rule

MEMORY_TYPES = ("run.started", "feedback.recorded", "episode.stored", "rule.added", "rule.edited",
                "rule.priority_changed", "rule.retired", "tool.label_changed", "case.completed")
"""The event types `MemoryState.apply` folds that audit needs (`case.received` only counts)."""


class AuditInputError(ValueError):
    """A bad audit request: unknown item or case, an as-of point outside the run (exit code 2)."""


@dataclass(frozen=True)
class AsOf:
    seq: int
    """The last seq folded."""
    case_index: int | None
    """The case whose completion this point is (when asked by case)."""
    cases_completed: int
    head: int
    """The run's last seq: `seq == head` means the memory at the end of the run."""

    def as_dict(self) -> dict:
        return {"seq": self.seq, "case_index": self.case_index, "cases_completed": self.cases_completed,
                "head": self.head, "at_head": self.seq == self.head}


def resolve_as_of(store: EventStore, run_id: str, as_of_case: int | None = None,
                  as_of_seq: int | None = None) -> AsOf:
    """The seq to fold up to: the run's head, a seq, or the `case.completed` of case index N."""
    require_spec(store, run_id)
    head = store.last_seq(run_id)
    if as_of_case is not None and as_of_seq is not None:
        raise AuditInputError("give --as-of-case or --as-of-seq, not both")
    case_index = None
    if as_of_case is not None:
        row = store.conn.execute(
            "SELECT seq FROM events WHERE run_id = ? AND type = 'case.completed' "
            "AND (payload->>'$.index')::BIGINT = ?", [run_id, as_of_case]).fetchone()
        if row is None:
            n = completed_count(store, run_id, head)
            raise AuditInputError(f"run {run_id!r} has no completed case with index {as_of_case} "
                                  f"(completed cases: indexes 0..{n - 1})" if n else
                                  f"run {run_id!r} has no completed cases")
        seq, case_index = int(row[0]), as_of_case
    elif as_of_seq is not None:
        if not 0 <= as_of_seq <= head:
            raise AuditInputError(f"--as-of-seq {as_of_seq} is outside run {run_id!r} (seqs 0..{head})")
        seq = as_of_seq
    else:
        seq = head
    return AsOf(seq, case_index, completed_count(store, run_id, seq), head)


def completed_count(store: EventStore, run_id: str, upto_seq: int) -> int:
    return int(store.conn.execute(
        "SELECT count(*) FROM events WHERE run_id = ? AND type = 'case.completed' AND seq <= ?",
        [run_id, upto_seq]).fetchone()[0])


def memory_at(store: EventStore, run_id: str, upto_seq: int | None = None) -> MemoryState:
    """The run's memory state after folding every event up to `upto_seq` (None: the head)."""
    state = MemoryState()
    cur = store.conn.cursor()  # payloads only: meta is never state, and decoding it costs
    try:
        cur.execute("SELECT seq, type, schema_version, payload FROM events WHERE run_id = ? AND seq <= ? "
                    "AND type IN (SELECT unnest(?::VARCHAR[])) ORDER BY seq",
                    [run_id, upto_seq if upto_seq is not None else 2**62, list(MEMORY_TYPES)])
        while rows := cur.fetchmany(10_000):
            for seq, type_, version, payload in rows:
                data = upcast(type_, int(version), json.loads(payload))
                state.apply(int(seq), payload_class(type_).model_validate(data))
    finally:
        cur.close()
    row = store.conn.execute(
        "SELECT count(*), max(seq) FROM events WHERE run_id = ? AND type = 'case.received' AND seq <= ?",
        [run_id, upto_seq if upto_seq is not None else 2**62]).fetchone()
    state.cases_received = int(row[0])
    if upto_seq is not None:
        state.last_seq = upto_seq
    return state


def utility_of(rule: Rule, state: MemoryState, policy: PolicyConfig) -> float | None:
    if not isinstance(policy, EvoMedAgentPolicy):
        return None
    return round(rule_utility(rule, state.feedback_count, policy), 6)


def case_indexes(store: EventStore, run_id: str) -> dict[str, int]:
    """case_id -> its index in the run's stream."""
    rows = store.conn.execute(
        "SELECT case_id, (payload->>'$.index')::BIGINT FROM events WHERE run_id = ? AND type = 'case.received'",
        [run_id]).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def resolve_case(store: EventStore, run_id: str, ref: str) -> tuple[str, int]:
    """A case by id, or by its index in the stream (`17` or `#17`) when no case has that id."""
    require_spec(store, run_id)
    row = store.conn.execute(
        "SELECT case_id, (payload->>'$.index')::BIGINT FROM events WHERE run_id = ? AND type = 'case.received' "
        "AND case_id = ?", [run_id, ref]).fetchone()
    if row is None:
        digits = ref.removeprefix("#")
        if digits.isdigit():
            row = store.conn.execute(
                "SELECT case_id, (payload->>'$.index')::BIGINT FROM events WHERE run_id = ? "
                "AND type = 'case.received' AND (payload->>'$.index')::BIGINT = ?", [run_id, int(digits)]).fetchone()
    if row is None:
        n = store.conn.execute("SELECT count(*) FROM events WHERE run_id = ? AND type = 'case.received'",
                               [run_id]).fetchone()[0]
        raise AuditInputError(f"run {run_id!r} received no case {ref!r} (give a case id, or an index 0..{n - 1})")
    return row[0], int(row[1])


def short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
