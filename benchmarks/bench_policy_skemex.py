"""SkeMex's memory overhead per case with a large skill repository (sim backbone, warm cache).

    python benchmarks/bench_policy_skemex.py [--skills 10000] [--cases 200] [--json]

Per case: everything but model calls — retrieval (three bucket searches, filters, value-aware
scoring, quotas, rendering), the sim's act, feedback, the trajectory entering the learning
window, and, every 30th case, distillation (the sim's offline answers stand in for the model),
the utility update and, every second window, governance. Synthetic skills get seeded random
unit vectors in the embedding cache and are appended directly as `skill.drafted` +
`skill.reviewed` events (as benchmarks/bench_core.py does for rules). Capacity control is off
(`no-capacity`) so the repository stays at --skills for the whole measurement; merging,
deprecation and maturation run as configured. Target: p50 ≤ 10 ms.
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
    bench_store, repeated_cases, seed_run, synthetic_words, time_cases, unit_vector)

from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.skemex import retrieval  # noqa: E402
from grandrounds.handlers.policies.skemex.config import SkeMexPolicy  # noqa: E402
from grandrounds.handlers.policies.skemex.policy import case_tools, skill_memory  # noqa: E402
from grandrounds.handlers.runs import RunSpec, open_run  # noqa: E402
from grandrounds.handlers.policies.skemex import events as sk  # noqa: E402
from grandrounds.store.events import NewEvent  # noqa: E402
from grandrounds.handlers.policies.skemex.memory import skill_key_text  # noqa: E402

def synthetic_skills(n: int, categories: list[str], dim: int, rng: np.random.Generator
                     ) -> tuple[list[NewEvent], dict[str, np.ndarray]]:
    """40 % general skills, the rest task-level spread over the example categories."""
    events, vectors = [], {}
    counters = {"general": 0, "task": 0}
    for i in range(n):
        branch = "general" if i % 5 < 2 else "task"
        sid = f"{branch[0]}{counters[branch]:06d}"
        counters[branch] += 1
        words = synthetic_words(rng)
        body = sk.SkillBody(name=f"synthetic_{i}", description=f"When a case presents with {', '.join(words[:3])}.",
                            applicable_conditions=f"The presentation includes {', '.join(words)}.",
                            core_action=f"If the presentation includes {', '.join(words)}: favour 'option {i}'.",
                            trigger=words)
        vectors[skill_key_text(body)] = unit_vector(rng, dim)
        cat = categories[i % len(categories)] if branch == "task" else None
        events.append(NewEvent(sk.SkillDrafted(skill_id=sid, branch=branch, category=cat, body=body, utility=0.5,
                                               source_case_id=f"syn-{i}"), f"syn-{i}"))
        events.append(NewEvent(sk.SkillReviewed(skill_id=sid, kind="create", accepted=True, reason="synthetic",
                                                source_case_id=f"syn-{i}"), f"syn-{i}"))
    return events, vectors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skills", type=int, default=10_000)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    store, cache = bench_store("gr-bench-skemex-")
    spec = RunSpec(policy=SkeMexPolicy(capacity=False), seed=0)
    base = load_cases(ROOT / "examples" / "cases.jsonl")[0]
    categories = sorted({c.category for c in base})
    events, vectors = synthetic_skills(args.skills, categories, cache.embedder.dim, rng)
    for text, vec in vectors.items():
        cache.put(text, vec)
    cases = repeated_cases(base, args.cases)

    def run(run_id: str) -> tuple[list[float], object]:
        seed_run(store, run_id, spec, cache, events)
        ctx, _ = open_run(store, run_id, spec, cache)
        return time_cases(ctx, cases)[0], ctx

    run("warm")  # fills the embedding cache with every text these cases produce (questions, drafts)
    cache.flush()
    misses = cache.misses
    times, ctx = run("measure")
    ms = sorted(t * 1000 for t in times)
    mem = skill_memory(ctx)
    cfg = spec.policy
    misses_during_run = cache.misses - misses
    queries = [cache.get(c.question) for c in base]  # outside the timing: the cache is warm in a run
    t = time.perf_counter()
    reps = 5
    for _ in range(reps):
        for c, q in zip(base, queries):
            retrieval.select(retrieval.candidates(mem, cfg, c.case_id, c.category, case_tools(ctx, c), q), cfg)
    select_ms = (time.perf_counter() - t) * 1000 / (reps * len(base))
    out = {
        "skills": args.skills, "cases": args.cases,
        "live_skills_at_end": sum(1 for s in mem.skills.values() if s.live),
        "per_case_ms": {"p50": round(statistics.median(ms), 3), "p90": round(ms[int(0.9 * len(ms))], 3),
                        "mean": round(statistics.fmean(ms), 3), "max": round(ms[-1], 3)},
        "retrieval_select_ms": round(select_ms, 4),
        "embedding_misses": misses_during_run,
        "target_p50_ms": 10.0,
        "note": "sim backbone, warm embedding cache, commit per case; capacity off so the repository stays full",
    }
    store.close()
    print_result(out, args.json)


if __name__ == "__main__":
    from grandrounds.store.vector_index import single_threaded_blas

    with single_threaded_blas():
        main()
