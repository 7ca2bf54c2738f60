"""Core numbers of DESIGN §9, measured side by side in one process.

    python benchmarks/bench_core.py [--items 10000] [--cases 200] [--json]

- append throughput: one batched INSERT per stage vs one event per transaction;
- per-case memory overhead (all but model calls: sim backbone, warm embedding cache) with a
  memory of --items items (half rules, half episodes), p50/p90;
- retrieval (scoring and filtering included) vs raw hnswlib queries on the same vectors;
- rebuilding every projection from the log, and restarting from a checkpoint;
- peak RSS.
Synthetic memory items get random unit vectors (seeded) in the embedding cache: the point is
the machinery's cost, not embedding quality. Case questions are embedded by the real model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    print_result,
    bench_store, peak_rss_mb, repeated_cases, seed_run, synthetic_words, time_cases, unit_vector)

from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.config import EvoMedAgentPolicy  # noqa: E402
from grandrounds.handlers.policies.evo_medagent.policy import evo_retrieve as _evo_retrieve, select_episodes, select_rules  # noqa: E402
from grandrounds.handlers.runs import RunSpec, open_run  # noqa: E402
from grandrounds.handlers.policies.evo_medagent import events as evo  # noqa: E402
from grandrounds.store import event_types as ev  # noqa: E402
from grandrounds.store.events import NewEvent  # noqa: E402
from grandrounds.store.projection import open_projection, rebuild, save_checkpoint  # noqa: E402

def synthetic_memory(n_items: int, rng: np.random.Generator) -> tuple[list[NewEvent], dict[str, np.ndarray]]:
    events, vectors = [], {}
    for i in range(n_items):
        words = synthetic_words(rng)
        vec = unit_vector(rng)
        if i % 2 == 0:
            text = f"If the presentation includes {', '.join(words)}: favour 'option {i}'."
            events.append(NewEvent(evo.RuleAdded(rule_id=f"rule-syn-{i}", text=text, trigger=words,
                                                priority=int(i % 3), source_case_id=f"syn-{i}"), f"syn-{i}"))
        else:
            text = f"Synthetic case {i}: {' '.join(words)}."
            events.append(NewEvent(evo.EpisodeStored(
                episode_id=f"ep-syn-{i}", case_id=f"syn-{i}", descriptor=text, trace=[], answer="A", gold="A",
                correct=True, summary=f"summary {i}", guideline=f"guideline {' '.join(words)}",
                trigger=words), f"syn-{i}"))
        vectors[text] = vec
    return events, vectors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--retrieval-rounds", type=int, default=21,
                    help="alternating raw/selection passes over the example questions (median ratio reported)")
    ap.add_argument("--only", choices=("retrieval",), default=None,
                    help="retrieval: seed the memory and measure selection vs raw hnswlib only (minutes less)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    out: dict = {"items": args.items, "cases": args.cases}
    store, cache = bench_store("gr-bench-")
    spec = RunSpec(policy=EvoMedAgentPolicy(), seed=0)

    full_run = args.only is None
    # --- append throughput: batched vs one event per transaction --------------------------
    one = [] if not full_run else [NewEvent(ev.CaseCompleted(index=i, correct=True)) for i in range(300)]
    t = time.perf_counter()
    for i, e in enumerate(one):
        store.append("single", [e], i - 1)
    single_rate = len(one) / max(time.perf_counter() - t, 1e-9)
    stage = [NewEvent(ev.CaseCompleted(index=i, correct=True)) for i in range(8)]  # a stage's batch
    t = time.perf_counter()
    for k in range(300 if full_run else 0):
        store.append("stagebatch", stage, k * 8 - 1)
    stage_rate = (300 * 8 if full_run else 0) / max(time.perf_counter() - t, 1e-9)
    events, vectors = synthetic_memory(args.items, rng)
    for text, vec in vectors.items():
        cache.put(text, vec)
    bulk_rate = seed_run(store, "measure", spec, cache, events)
    if full_run:
        seed_run(store, "warm", spec, cache, events)
        out["append_events_per_s"] = {"one_event_per_txn": round(single_rate), "stage_batches_of_8": round(stage_rate),
                                      "bulk_batches_of_1000": round(bulk_rate)}

    # --- per-case overhead, warm cache ----------------------------------------------------
    base = load_cases(ROOT / "examples" / "cases.jsonl")[0]
    cases = repeated_cases(base, args.cases)

    def run_cases(run_id: str, per_stage: bool, group: int = 1) -> list[float]:
        ctx, _ = open_run(store, run_id, spec, cache)
        return time_cases(ctx, cases, per_stage, group)[0]

    if full_run:
        run_cases("warm", per_stage=False)  # fills the embedding cache with every text these cases produce
        cache.flush()
        modes = {"group commit (64 cases)": ("measure", False, 64),
                 "group commit (16 cases)": ("measure-g16", False, 16),
                 "commit per case": ("measure-case", False, 1),
                 "commit per stage": ("measure-stage", True, 1)}
        for run_id, _, _ in list(modes.values())[1:]:
            seed_run(store, run_id, spec, cache, events)
        misses_before = cache.misses
        out["per_case_ms"] = {}
        for name, (run_id, per_stage, group) in modes.items():
            ms = sorted(x * 1000 for x in run_cases(run_id, per_stage, group))
            out["per_case_ms"][name] = {
                "p50": round(statistics.median(ms), 3), "p90": round(ms[int(0.9 * len(ms))], 3),
                "p99": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 3), "mean": round(statistics.fmean(ms), 3)}
        out["per_case_ms"]["embedding_misses"] = cache.misses - misses_before

    # --- retrieval vs raw hnswlib ---------------------------------------------------------
    proj = open_projection(store, "measure", cache).projection
    cfg = spec.policy
    ctx, _ = open_run(store, "measure", spec, cache)
    queries = [cache.get(c.question) for c in base]
    part = proj.state.policy_memory  # Evo-MedAgent's part holds the two indexes
    assert part.rule_index.uses_hnsw and part.episode_index.uses_hnsw

    # CPU time of this process (one thread: BLAS is limited to one): on a shared core, wall time
    # also counts whatever else ran meanwhile, which swamps a ratio near 1.
    def raw_pass() -> float:
        t = time.process_time()
        for q in queries:
            part.rule_index._hnsw.knn_query(q.reshape(1, -1), k=cfg.candidate_pool, num_threads=1)
            part.episode_index._hnsw.knn_query(q.reshape(1, -1), k=cfg.top_k_episodes + 1, num_threads=1)
        return time.process_time() - t

    def selection_pass() -> float:
        t = time.process_time()
        for c, q in zip(base, queries):
            select_rules(proj, cfg, c.case_id, q)
            select_episodes(proj, cfg, c.case_id, q)
        return time.process_time() - t

    # Short passes, alternating which goes first, one ratio per round: on a shared machine a burst
    # of other work then lands in one round's ratio instead of in one side's whole total.
    raws, sels, ratios = [], [], []
    for r in range(args.retrieval_rounds):
        if r % 2:
            s_, r_ = selection_pass(), raw_pass()
        else:
            r_, s_ = raw_pass(), selection_pass()
        raws.append(r_)
        sels.append(s_)
        ratios.append(s_ / r_)
    reps = 5
    raw = statistics.median(raws) / len(queries)
    selection = statistics.median(sels) / len(base)
    t = time.perf_counter()
    for _ in range(reps):
        for c in base:
            _evo_retrieve(ctx.projection, cfg, c, proj.seq)
    full = (time.perf_counter() - t) / (reps * len(base))
    out["retrieval_ms"] = {"raw_hnswlib": round(raw * 1000, 4),
                           "selection": round(selection * 1000, 4),
                           "selection_ratio": round(statistics.median(ratios), 3),
                           "selection_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                           "rounds": args.retrieval_rounds,
                           "retrieve_stage": round(full * 1000, 4),
                           "note": "CPU times, median of per-round ratios; selection = search + exact rescoring + "
                                   "utility/score + leakage filter; "
                                   "the stage also embeds (cache), renders the prefix and builds the event"}

    if full_run:  # --- rebuild and checkpoint restart ---------------------------------------
        t = time.perf_counter()
        rebuilt = rebuild(store, "measure", cache)
        out["rebuild_s"] = round(time.perf_counter() - t, 3)
        out["rebuild_events"] = rebuilt.seq + 1
        save_checkpoint(store, "measure", rebuilt)
        t = time.perf_counter()
        opened = open_projection(store, "measure", cache)
        out["checkpoint_restart_s"] = round(time.perf_counter() - t, 3)
        assert opened.how == "checkpoint" and opened.projection.state == rebuilt.state
    out["peak_rss_mb"] = peak_rss_mb()
    store.close()

    print_result(out, args.json)


if __name__ == "__main__":
    from grandrounds.store.vector_index import single_threaded_blas

    with single_threaded_blas():  # as `grandrounds run` does
        main()
