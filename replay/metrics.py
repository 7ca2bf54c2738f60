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


def rolling_accuracy(outcomes: list[bool], window: int) -> list[float]:
    """Accuracy over the last `window` cases at each point (fewer at the start): the cumulative
    curve flattens as a run grows, so a change late in the stream shows here first."""
    if window < 1:
        raise ValueError("window must be at least 1")
    out, correct = [], 0
    for i, ok in enumerate(outcomes):
        correct += ok
        if i >= window:
            correct -= outcomes[i - window]
        out.append(round(correct / min(i + 1, window), 6))
    return out


def default_window(n: int) -> int:
    """A rolling window that shows trends on both 20 and 2,500 cases: a tenth of the run, 5..100."""
    return max(5, min(100, n // 10))


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
