"""Determinism verification: re-execute a run from its own log and compare event by event.

The run's spec (first event) and case log (`case.received` payloads) are all a re-execution
needs. It runs into a scratch in-memory store sharing the embedding cache, and its events
are compared with the recorded ones as (seq, type, payload) — what the fingerprint covers —
so a difference is reported as the first event that differs, with the first differing field.
The recorded log's hash chain is checked too: an event edited behind the API's back breaks
the chain at that seq even when its content would replay the same.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from grandrounds.handlers.cases import FhirCase
from grandrounds.handlers.environments.base import EnvironmentRecord
from grandrounds.replay.caselog import case_log, require_spec, seeded_memory
from grandrounds.replay.environment import EnvironmentUnavailable, fhir_case_log  # noqa: F401 (fhir_case_log: re-exported)
from grandrounds.replay.environment import recorded_environment as _recorded_environment
from grandrounds.replay.environment import reopen_environment as _reopen_environment
from grandrounds.replay.execute import execute
from grandrounds.store.canonical import canonical_json
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.eventstore import EventStore
from grandrounds.store.events import StoredEvent


class NotVerifiable(EnvironmentUnavailable):
    """The run cannot be re-executed here (bad input: exit code 2)."""


@dataclass(frozen=True)
class Divergence:
    seq: int
    case_id: str | None
    recorded_type: str | None
    replayed_type: str | None
    path: str
    """Where the payloads first differ: `type`, a dotted field path, or `end of log`."""
    recorded: Any
    replayed: Any

    def as_dict(self) -> dict:
        return {"seq": self.seq, "case_id": self.case_id, "recorded_type": self.recorded_type,
                "replayed_type": self.replayed_type, "path": self.path,
                "recorded": _clip(self.recorded), "replayed": _clip(self.replayed)}


def _clip(value: Any, limit: int = 300) -> Any:
    text = canonical_json(value) if not isinstance(value, str) else value
    return value if len(text) <= limit else text[:limit] + "…"


def first_difference(a: Any, b: Any, path: str = "payload") -> tuple[str, Any, Any] | None:
    """The first (path, a, b) where two JSON values differ, depth first in key order."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}", a.get(key), b.get(key)
            d = first_difference(a[key], b[key], f"{path}.{key}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        if len(a) != len(b):
            return f"{path}.length", len(a), len(b)
        return None
    if canonical_json(a) != canonical_json(b):
        return path, a, b
    return None


def compare_logs(recorded: list[StoredEvent], replayed: list[StoredEvent]) -> Divergence | None:
    for r, p in zip(recorded, replayed):
        if r.type != p.type:
            return Divergence(r.seq, r.case_id, r.type, p.type, "type", r.type, p.type)
        if canonical_json(r.payload) != canonical_json(p.payload):
            path, a, b = first_difference(r.payload, p.payload) or ("payload", r.payload, p.payload)
            return Divergence(r.seq, r.case_id, r.type, p.type, path, a, b)
    if len(recorded) != len(replayed):
        n = min(len(recorded), len(replayed))
        longer = recorded if len(recorded) > n else replayed
        e = longer[n]
        return Divergence(e.seq, e.case_id, e.type if longer is recorded else None,
                          e.type if longer is replayed else None, "end of log",
                          len(recorded), len(replayed))
    return None


def verify_run(store: EventStore, run_id: str, cache: EmbeddingCache) -> dict:
    """The DESIGN §8 verify object, plus the first divergence and the chain check."""
    spec = require_spec(store, run_id)
    if spec.backbone != "sim":
        raise NotVerifiable(
            f"run {run_id!r} used the {spec.backbone!r} backbone: verify re-executes runs whose backbone "
            "is offline and deterministic (sim); model runs need the record backend to be re-served")
    record = recorded_environment(store, run_id)
    if record is None:
        cases = case_log(store, run_id)
        opened = nullcontext(None)
    else:
        cases = fhir_case_log(store, run_id)
        opened = reopen_environment(record, run_id, spec.source, cases, store)
    head = store.last_seq(run_id)
    completed = store.conn.execute(
        "SELECT count(*) FROM events WHERE run_id = ? AND type = 'case.completed'", [run_id]).fetchone()[0]
    chain_break = store.verify_chain(run_id)

    scratch = EventStore(":memory:")
    try:
        with opened as environment:  # a FHIR run's sandbox: up for the re-execution only
            execute(scratch, cache, run_id, spec, cases, checkpoint=False, seeded=seeded_memory(store, run_id),
                    environment=environment)
        complete = completed == len(cases)
        # An interrupted run's log ends inside a case that the re-execution finishes: compare
        # the prefix the recorded log has.
        upto = None if complete else head
        recorded = store.read(run_id)
        replayed = scratch.read(run_id, upto_seq=upto)
        divergence = compare_logs(recorded, replayed)
        fingerprint = store.fingerprint(run_id)
        replayed_fp = scratch.fingerprint(run_id, upto_seq=upto)
    finally:
        scratch.close()
    cache.flush()
    identical = fingerprint == replayed_fp and divergence is None
    return {
        "run_id": run_id,
        "fingerprint": fingerprint,
        "replayed_fingerprint": replayed_fp,
        "identical": identical,
        "events": head + 1,
        "cases": len(cases),
        "complete": complete,
        "first_divergence": divergence.as_dict() if divergence else None,
        "chain_intact": chain_break is None,
        "chain_break_seq": chain_break,
        "ok": identical and chain_break is None,
    }


# --- runs of tool tasks (MedAgentBench): their environment is rebuilt from the recorded files --------
# (shared with order replays: replay/environment.py)


def recorded_environment(store: EventStore, run_id: str) -> EnvironmentRecord | None:
    return _recorded_environment(store, run_id, error=NotVerifiable)


def reopen_environment(record: EnvironmentRecord, run_id: str, source: str | None, cases: list[FhirCase],
                       store: EventStore | None = None):
    """The run's MedAgentBench environment built again (a fresh sandbox), once its files check out."""
    return _reopen_environment(record, run_id, source, cases, what="verify", error=NotVerifiable, store=store)
