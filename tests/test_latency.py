"""The Kafka worker's latency statistics stay bounded however long it runs, and stay accurate."""

from __future__ import annotations

import random

from grandrounds.streams.kafka_worker import WorkerStats
from grandrounds.streams.latency import LatencyHistogram


def test_a_histogram_holds_a_bounded_number_of_counters_whatever_it_sees():
    h = LatencyHistogram()
    rng = random.Random(7)
    for _ in range(200_000):
        h.add(rng.lognormvariate(2.0, 1.5))
    h.add(0.0)
    h.add(1e12)  # beyond the last bucket: counted there
    assert h.n == 200_002 and len(h.counts) < 500


def test_quantiles_are_within_five_percent():
    rng = random.Random(3)
    xs = [rng.uniform(0.5, 5000.0) for _ in range(20_001)]
    h = LatencyHistogram()
    for x in xs:
        h.add(x)
    exact = sorted(xs)
    for q in (0.5, 0.9, 0.99):
        e = exact[min(len(xs) - 1, int(q * len(xs)))]
        assert abs(h.quantile(q) - e) <= 0.05 * e + 1e-9, (q, h.quantile(q), e)
    assert h.max == max(xs) and LatencyHistogram().quantile(0.5) is None


def test_worker_stats_keep_histograms_not_lists():
    stats = WorkerStats()
    for i in range(10_000):
        stats.service_ms["act"].add(i % 50)
        stats.hop_ms["act"].add(1.0)
        stats.restore_seconds.append(0.1)
    assert len(stats.restore_seconds) == 64
    lat = stats.as_dict()["latency_ms"]["act"]
    assert lat["n"] == 10_000 and 23 <= lat["service_p50"] <= 26 and lat["hop_p99"] == 1.0
