"""Run outcomes straight from the log (SQL over `case.completed`) and their summaries."""

from __future__ import annotations

from grandrounds.replay.metrics import cumulative_accuracy
from grandrounds.store.eventstore import EventStore


def outcomes_of(store: EventStore, run_id: str) -> list[bool]:
    rows = store.conn.execute(
        "SELECT (payload->>'$.correct')::BOOLEAN FROM events "
        "WHERE run_id = ? AND type = 'case.completed' ORDER BY seq", [run_id]).fetchall()
    return [bool(r[0]) for r in rows]


def summarise(results: list[bool]) -> dict:
    correct = sum(results)
    return {
        "cases": len(results),
        "correct": correct,
        "accuracy": round(correct / len(results), 6) if results else 0.0,
        "cumulative_accuracy": cumulative_accuracy(results),
    }
