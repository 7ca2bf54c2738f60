"""RetroSum's per-case memory overhead with a large experience bank (DESIGN §9).

    python benchmarks/bench_policy_retrosum.py [--experiences 10000] [--cases 200] [--json]

Per-case cost of everything but model calls — the five stages with the sim backbone (its
lesson writer is the offline one), retrieval from the bank, the experience event and its
fold, the commit — with a warm embedding cache, p50/p90. Like benchmarks/bench_core.py the
bank is synthetic: --experiences `experience.stored` events appended directly to the log,
their patient contexts given seeded random unit vectors in the embedding cache (so, in
384 dimensions, they sit near cosine 0 from every real case and are never retrieved: the
cost measured is the search over them). The real example cases then run on top, storing and
retrieving their own experiences. Also: retrieval alone (search + threshold + guard + items +
prefix) against a raw hnswlib query on the same vectors, and rebuilding the bank from the log.
The per-case time includes the case's commit to DuckDB; `commit_ms` reports that part alone
(it is the same for every policy) and `per_case_without_commit_ms` the rest.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    print_result,
    bench_store, ms_summary, peak_rss_mb, repeated_cases, seed_run, synthetic_words, time_cases, unit_vector)

from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.retrosum.config import RetroSumPolicy  # noqa: E402
from grandrounds.handlers.policies.retrosum.policy import RetroSumMemory  # noqa: E402
from grandrounds.handlers.runs import RunSpec, open_run  # noqa: E402
from grandrounds.store.events import NewEvent  # noqa: E402
from grandrounds.handlers.policies.retrosum.events import ExperienceStored, Lesson  # noqa: E402
from grandrounds.store.projection import rebuild  # noqa: E402

def synthetic_bank(n: int, rng: np.random.Generator) -> tuple[list[NewEvent], dict[str, np.ndarray]]:
    events, vectors = [], {}
    for i in range(n):
        words = synthetic_words(rng)
        context = f"Synthetic patient {i} presents with {', '.join(words)}."
        vectors[context] = unit_vector(rng)
        events.append(NewEvent(ExperienceStored(
            experience_id=f"exp-syn-{i:05d}", source_case_id=f"syn-{i}", context=context,
            actor_lessons=[Lesson(text=f"When the presentation includes {', '.join(words)}: favour 'option {i}'.",
                                  trigger=words)],
            summariser_lessons=[Lesson(text=f"Keep these findings verbatim: {', '.join(words[:3])}.")],
            answer="A", gold="A", correct=True), f"syn-{i}"))
    return events, vectors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiences", type=int, default=10_000)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    out: dict = {"experiences": args.experiences, "cases": args.cases, "backbone": "sim"}
    store, cache = bench_store("gr-bench-retrosum-")
    spec = RunSpec(policy=RetroSumPolicy(), seed=0)
    events, vectors = synthetic_bank(args.experiences, rng)
    for text, vec in vectors.items():
        cache.put(text, vec)

    base = load_cases(ROOT / "examples" / "cases.jsonl")[0]
    cases = repeated_cases(base, args.cases)

    def run_cases(run_id: str) -> tuple[list[float], list[float]]:
        """Per-case wall time, and the part of it spent committing the case's events (DuckDB)."""
        ctx, _ = open_run(store, run_id, spec, cache)
        return time_cases(ctx, cases)

    seed_run(store, "warm", spec, cache, events)
    seed_run(store, "measure", spec, cache, events)
    run_cases("warm")  # embeds every text these cases produce (their patient contexts)
    cache.flush()
    misses = cache.misses
    times, commits = run_cases("measure")
    out["per_case_ms"] = ms_summary(times)
    out["per_case_ms"]["embedding_misses"] = cache.misses - misses
    out["commit_ms"] = ms_summary(commits)  # included in per_case_ms: the log append, policy-independent
    out["per_case_without_commit_ms"] = ms_summary([t - c for t, c in zip(times, commits)])

    # --- retrieval vs raw hnswlib, on the bank as the measured run left it ------------------
    ctx, _ = open_run(store, "measure", spec, cache)
    part = ctx.projection.state.policy_memory
    out["bank_size"] = len(part)
    out["uses_hnsw"] = part.index.uses_hnsw
    mech = RetroSumMemory(spec.policy)
    queries = [cache.get(c.question.strip()) for c in base]
    reps = 5
    if part.index.uses_hnsw:
        t = time.perf_counter()
        for _ in range(reps):
            for q in queries:
                part.index._hnsw.knn_query(q.reshape(1, -1), k=2, num_threads=1)
        raw = (time.perf_counter() - t) / (reps * len(queries))
    else:
        raw = float("nan")
    t = time.perf_counter()
    for _ in range(reps):
        for c in base:
            mech.retrieve(ctx, c, ctx.projection.seq)
    full = (time.perf_counter() - t) / (reps * len(base))
    out["retrieval_ms"] = {"raw_hnswlib_k2": round(raw * 1000, 4), "retrieve_stage": round(full * 1000, 4),
                           "ratio": round(full / raw, 2) if raw == raw else None,
                           "note": "retrieve = embed (cache) + search + exact rescoring + threshold + leakage "
                                   "guard + items + prefix rendering"}

    t = time.perf_counter()
    rebuilt = rebuild(store, "measure", cache)
    out["rebuild_s"] = round(time.perf_counter() - t, 3)
    out["rebuild_events"] = rebuilt.seq + 1
    out["peak_rss_mb"] = peak_rss_mb()
    out["target"] = "per-case p50 <= 10 ms (DESIGN §9)"
    store.close()
    print_result(out, args.json, width=16)


if __name__ == "__main__":
    from grandrounds.store.vector_index import single_threaded_blas

    with single_threaded_blas():  # as `grandrounds run` does
        main()
