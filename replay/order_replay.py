"""Order-sensitivity replays: a recorded run's case log under K seeded permutations.

Each permutation is a normal run with its own memory, the source's spec (or a
counterfactual one) and `source` naming the parent run. Run ids are derived from the
source, the permutation index and the seed, so asking again for the same replay finds the
runs already in the file and reuses them instead of running twice.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from handlers.cases import Case
from handlers.policies.config import PolicyConfig
from handlers.runs import RunMismatch, RunSpec, read_spec
from replay.caselog import case_log, require_spec
from replay.counterfactual import derived_spec, is_counterfactual, variant_tag
from replay.execute import JobResult, RunJob, run_jobs
from replay.permutations import permutations
from replay.stats import outcomes_of, summarise
from store.embeddings import EmbeddingCache
from store.eventstore import EventStore


class ReplayInputError(ValueError):
    """Bad replay flags (exit code 2)."""


@dataclass(frozen=True)
class PlannedRun:
    run_id: str
    k: int | None
    """Permutation index; None for the source order itself (`original`)."""
    order_seed: int | None
    job: RunJob


@dataclass(frozen=True)
class ReplayPlan:
    source: str
    source_spec: RunSpec
    spec: RunSpec
    seed: int
    tag: str | None
    cases: list[Case]
    runs: list[PlannedRun]


def plan_replay(store: EventStore, source: str, count: int, seed: int, *, policy: PolicyConfig | None = None,
                backbone: str | None = None, model: str | None = None, ablations: list[str] | None = None,
                sets: list[str] | None = None, original: bool = False, tag: str | None = None) -> ReplayPlan:
    source_spec = require_spec(store, source)
    if count < 0:
        raise ReplayInputError("--permutations must be 0 or more")
    if count == 0 and not original:
        raise ReplayInputError("nothing to run: give --permutations K ≥ 1, or --original")
    if seed < 0:
        raise ReplayInputError("--seed must be non-negative")
    cases = case_log(store, source)
    if not cases:
        raise ReplayInputError(f"run {source!r} has received no cases: nothing to replay")
    spec = derived_spec(source_spec, source, policy=policy, backbone=backbone, model=model,
                        ablations=ablations, sets=sets)
    if spec.backbone != "sim":
        raise ReplayInputError(
            f"replay executes runs with the offline sim backbone; {spec.backbone!r} would call a model for "
            f"every case of every permutation (serving recorded exchanges is not wired into replay yet). "
            "Pass --backbone sim to replay this case log with the simulator")
    if tag is None and is_counterfactual(source_spec, spec):
        tag = variant_tag(spec, ablations)
    stem = f"{source}-{tag}" if tag else source
    runs = []
    if original:
        rid = f"{stem}-original"
        runs.append(PlannedRun(rid, None, None, RunJob(rid, spec, tuple(cases))))
    for p in permutations(len(cases), count, seed):
        rid = f"{stem}-perm{p.k}-s{seed}"
        runs.append(PlannedRun(rid, p.k, p.order_seed, RunJob(rid, spec, tuple(cases[i] for i in p.order))))
    for r in runs:  # a name taken by a different configuration is bad input, before anything runs
        existing = read_spec(store, r.run_id)
        if existing is not None and existing != spec:
            raise RunMismatch(f"run {r.run_id!r} already exists with a different configuration; "
                              "pass --tag NAME to name this replay's runs differently")
    return ReplayPlan(source, source_spec, spec, seed, tag, cases, runs)


def execute_plan(store: EventStore, cache: EmbeddingCache, plan: ReplayPlan, workers: int = 1,
                 on_run: Callable[[PlannedRun, JobResult], None] | None = None) -> dict:
    """Run (or reuse) every planned run; returns the DESIGN §8 replay object."""
    t0 = time.perf_counter()
    by_id = {r.run_id: r for r in plan.runs}
    results = run_jobs(store, cache, [r.job for r in plan.runs], workers=workers,
                       on_done=(lambda j, res: on_run(by_id[j.run_id], res)) if on_run else None)
    elapsed = time.perf_counter() - t0
    return replay_result(store, plan, results, workers, elapsed)


def replay_result(store: EventStore, plan: ReplayPlan, results: list[JobResult], workers: int,
                  elapsed: float) -> dict:
    runs = []
    for r, res in zip(plan.runs, results):
        s = summarise(outcomes_of(store, r.run_id))
        runs.append({
            "run_id": r.run_id, "k": r.k, "order_seed": r.order_seed,
            "accuracy": s["accuracy"], "correct": s["correct"], "cases": s["cases"],
            "fingerprint": store.fingerprint(r.run_id), "reused": res.processed == 0,
            "seconds": round(res.seconds, 3), "cumulative_accuracy": s["cumulative_accuracy"],
        })
    accs = [r["accuracy"] for r in runs]
    mean = sum(accs) / len(accs)
    std = math.sqrt(sum((a - mean) ** 2 for a in accs) / len(accs))
    source_stats = summarise(outcomes_of(store, plan.source))
    executed = sum(res.processed for res in results)
    return {
        "source": plan.source,
        "source_accuracy": source_stats["accuracy"],
        "cases": len(plan.cases),
        "seed": plan.seed,
        "permutations": sum(1 for r in plan.runs if r.k is not None),
        "policy": plan.spec.policy.name,
        "backbone": plan.spec.backbone,
        "counterfactual": is_counterfactual(plan.source_spec, plan.spec),
        "tag": plan.tag,
        "runs": runs,
        "accuracy_mean": round(mean, 6),
        "accuracy_std": round(std, 6),
        "accuracy_min": min(accs),
        "accuracy_max": max(accs),
        "mean_curve": mean_curve([r["cumulative_accuracy"] for r in runs]),
        "workers": workers,
        "cases_executed": executed,
        "seconds": round(elapsed, 3),
        "cases_per_second": round(executed / elapsed, 1) if executed and elapsed > 0 else None,
    }


def mean_curve(curves: list[list[float]]) -> list[float]:
    n = min(len(c) for c in curves) if curves else 0
    return [round(sum(c[i] for c in curves) / len(curves), 6) for i in range(n)]
