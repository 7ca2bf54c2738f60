"""SELSM's memory overhead per case (DESIGN §9: ≤ 10 ms p50 with 10k memory items).

    python benchmarks/bench_policy_selsm.py [--records 10000] [--per-record 1] [--cases 200] [--json]

Everything but model calls: the sim backbone runs all five stages (retrieve, per-step
two-stage retrieval, act, feedback, K = 3 sampled trajectories judged offline, the entity
check, the record event, the fold) and each case's events are appended to DuckDB, with a
memory of --records records holding --per-record transitions each. Like bench_core.py, the
synthetic memory gets seeded random unit vectors (here: every text, through a seeded-random
embedder), the events are appended directly, and the embedding cache is warm (one warm-up
pass over the same cases first): the point is the machinery's cost, not embedding quality.
Reported for the paper's configuration and for the no-two-stage ablation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_dir, peak_rss_mb, repeated_cases, seed_run, time_cases  # noqa: E402

from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.base import agent_state  # noqa: E402
from grandrounds.handlers.policies.config import NoMemoryPolicy  # noqa: E402
from grandrounds.handlers.policies.selsm.config import SelsmPolicy  # noqa: E402
from grandrounds.handlers.runs import RunSpec, open_run  # noqa: E402
from grandrounds.store.canonical import sha256_hex  # noqa: E402
from grandrounds.store.embeddings import EmbeddingCache  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402
from grandrounds.store.events import NewEvent  # noqa: E402
from grandrounds.handlers.policies.selsm.events import LogicalSkill, RecordStored, StoredTransition  # noqa: E402
from grandrounds.store.vector_index import single_threaded_blas  # noqa: E402

DIM = 384


class SeededRandomEmbedder:
    """A unit vector per text, seeded by the text's hash: instant, deterministic, meaningless."""

    name = "bench-seeded-random-384"
    dim = DIM

    def embed_one(self, text: str) -> np.ndarray:
        v = np.random.default_rng(int(sha256_hex(text)[:15], 16)).standard_normal(DIM).astype(np.float32)
        return v / np.linalg.norm(v)


def synthetic_records(n: int, per_record: int) -> list[NewEvent]:
    events = []
    for i in range(n):
        query = f"Synthetic workflow {i}: retrieve and act on finding set {i % 97}."
        transitions = []
        for t in range(1, per_record + 1):
            skill = LogicalSkill(label="+" if (i + t) % 3 else "-", category="Parameter Mapping",
                                 scenario=f"Workflow family {i % 97}, round {t}.",
                                 logic="Map the findings to the option that explains all of them.",
                                 example=f"Finding set {i % 97} -> option text {i}.", avoidance="Do not guess.",
                                 trigger=["synthetic", f"family{i % 97}"])
            transitions.append(StoredTransition(skill_id=f"rec-syn-{i}.0.{t}", sample=0, round=t,
                                                state=agent_state(query, [("call x", f"obs {j}") for j in range(t - 1)]),
                                                action="call x", skill=skill))
        events.append(NewEvent(RecordStored(record_id=f"rec-syn-{i}", source_case_id=f"syn-{i}", query=query,
                                            transitions=transitions), f"syn-{i}"))
    return events


def measure(store: EventStore, cache: EmbeddingCache, spec: RunSpec, events: list[NewEvent], cases,
            label: str) -> dict:
    def run(run_id: str) -> tuple[list[float], int]:
        seed_run(store, run_id, spec, cache, events)
        ctx, _ = open_run(store, run_id, spec, cache)  # folds the synthetic memory (setup, not timed)
        with single_threaded_blas():
            times, _commits = time_cases(ctx, cases)
        part = ctx.projection.state.policy_memory
        return times, part.counts().get("selsm_transitions", 0) if part is not None else 0

    run(f"warm-{label}")  # every text these cases produce enters the cache
    misses = cache.misses
    times, transitions = run(f"measure-{label}")
    ms = sorted(x * 1000 for x in times)
    return {"p50": round(statistics.median(ms), 3), "p90": round(ms[int(0.9 * len(ms))], 3),
            "mean": round(statistics.fmean(ms), 3), "embedding_misses": cache.misses - misses,
            "transitions_at_end": transitions}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--per-record", type=int, default=1)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = bench_dir("gr-bench-selsm-")
    store = EventStore(tmp / "bench.duckdb")
    cache = EmbeddingCache(SeededRandomEmbedder(), store.conn)
    events = synthetic_records(args.records, args.per_record)
    base = load_cases(ROOT / "examples" / "cases.jsonl")[0]
    cases = repeated_cases(base, args.cases)
    out: dict = {"records": args.records, "transitions": args.records * args.per_record, "cases": args.cases,
                 "backbone": "sim", "note": "everything but model calls; warm embedding cache; commit per case",
                 "per_case_ms": {}}
    # `none` is the floor every policy pays (stages, event encoding, the DuckDB commit per case):
    # on a noisy machine the ratio to it is the steadier number.
    for label, policy in (("none", NoMemoryPolicy()), ("paper", SelsmPolicy()),
                          ("no-two-stage", SelsmPolicy(two_stage=False))):
        out["per_case_ms"][label] = measure(store, cache, RunSpec(policy=policy, seed=0), events, cases, label)
    floor = out["per_case_ms"]["none"]["p50"]
    for label in ("paper", "no-two-stage"):
        r = out["per_case_ms"][label]
        r["p50_over_none"] = round(r["p50"] / floor, 2)
        r["p50_above_none_ms"] = round(r["p50"] - floor, 3)
    out["target_p50_ms"] = 10.0
    out["peak_rss_mb"] = peak_rss_mb()
    store.close()
    if args.json:
        print(json.dumps(out))
    else:
        for label, r in out["per_case_ms"].items():
            extra = f", {r['p50_over_none']}x none" if "p50_over_none" in r else ""
            print(f"{label:>13}: p50 {r['p50']:.2f} ms  p90 {r['p90']:.2f} ms  mean {r['mean']:.2f} ms  "
                  f"(misses {r['embedding_misses']}, {r['transitions_at_end']} transitions at end{extra})")
        print(f"{out['records']} records / {out['transitions']} transitions, {args.cases} cases, "
              f"peak RSS {out['peak_rss_mb']} MB; target p50 ≤ 10 ms")


if __name__ == "__main__":
    main()
