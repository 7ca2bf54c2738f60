"""Run outcomes from the log (`case.completed`, through the read model) and their summaries."""

from __future__ import annotations

from grandrounds.replay.metrics import cumulative_accuracy
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog


def outcomes_of(store: EventStore, run_id: str) -> list[bool]:
    return [bool(e.payload["correct"]) for e in EventLog(store).events(run_id, types=["case.completed"], meta=False)]


def summarise(results: list[bool]) -> dict:
    correct = sum(results)
    return {
        "cases": len(results),
        "correct": correct,
        "accuracy": round(correct / len(results), 6) if results else 0.0,
        "cumulative_accuracy": cumulative_accuracy(results),
    }


BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_STREAM = 0xB0075  # a SeedSequence word of its own: never the stream the case orders come from


def bootstrap_mean_ci(values: list[float], seed: int, level: float = 0.95,
                      resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float] | None:
    """Percentile bootstrap interval for the mean of `values` (the replays' accuracies): resample
    them with replacement `resamples` times and take the central `level` of the means. Seeded from
    the replay's seed, so the same replay prints the same interval on any machine. None for fewer
    than two values (one order says nothing about the spread). With few orders (K = 5) it is rough:
    it describes these orders, not every order."""
    import numpy as np

    if len(values) < 2:
        return None
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, BOOTSTRAP_STREAM])))
    arr = np.asarray(values, dtype=np.float64)
    means = arr[rng.integers(0, len(arr), size=(resamples, len(arr)))].mean(axis=1)
    tail = (1.0 - level) / 2
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return round(float(lo), 6), round(float(hi), 6)
