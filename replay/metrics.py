"""Run summaries computed from the log: accuracy, cumulative accuracy, memory counts, fingerprint."""

from __future__ import annotations

from grandrounds.store.event_types import CaseCompleted, RunStarted
from grandrounds.store.eventstore import EventStore
from grandrounds.store.memory_state import MemoryState


def cumulative_accuracy(outcomes: list[bool]) -> list[float]:
    out, correct = [], 0
    for i, ok in enumerate(outcomes, start=1):
        correct += ok
        out.append(round(correct / i, 6))
    return out


def outcomes(store: EventStore, run_id: str) -> list[bool]:
    return [e.decode().correct for e in store.iter(run_id, types=[CaseCompleted.event_type])]


def run_summary(store: EventStore, run_id: str, state: MemoryState) -> dict:
    """The DESIGN §8 object for `grandrounds run`, plus the curve and run settings."""
    started = store.read(run_id, upto_seq=0)[0].decode()
    assert isinstance(started, RunStarted)
    results = outcomes(store, run_id)
    correct = sum(results)
    head = store.last_seq(run_id)
    return {
        "run_id": run_id,
        "cases": len(results),
        "correct": correct,
        "accuracy": round(correct / len(results), 6) if results else 0.0,
        "events": head + 1,
        "fingerprint": store.fingerprint(run_id),
        "memory": state.counts(),
        "policy": started.policy_name,
        "backbone": started.backbone,
        "seed": started.seed,
        "cumulative_accuracy": cumulative_accuracy(results),
    }
