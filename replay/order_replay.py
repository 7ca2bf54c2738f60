"""Order-sensitivity replays: a recorded run's case log under K seeded permutations.

Each permutation is a normal run with its own memory, the source's spec (or a
counterfactual one) and `source` naming the parent run. Run ids are derived from the
source, the permutation index and the seed, so asking again for the same replay finds the
runs already in the file and reuses them instead of running twice.

A source run made with a model (backbone `openai` or `record`) is replayed with the record
backend: every permutation is served the source's recorded exchanges by request hash (a
fresh copy per run: serving consumes them) and keeps the source's backbone in its spec, so
its fingerprint compares with the source's and with other replays. A request the record does
not hold is a `ReplayDivergence` (the run is abandoned, nothing of it is written) unless live
fall-through is allowed; then the model is called and the run's `llm_calls` says how many
calls were served from the record and how many went live. Such runs execute one after the
other in this process: model clients are not sent to worker processes.

A run of MedAgentBench FHIR tasks (`grandrounds run --env medagentbench`) is replayed against its
environment built again from the files its `run.started` meta records (checked against their
hashes first: a moved or changed file is refused, exit code 2, as `grandrounds verify` does). The
environment is opened once for the whole plan and its runs execute one after the other in this
process (a sandbox is not sent to worker processes); each case gets fresh FHIR tools, so runs share
no trajectory. The sandbox only records POSTs (what later GETs return never changes), so sharing it
between runs cannot make one run's events depend on another's.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

from grandrounds.handlers.cases import Case, FhirCase
from grandrounds.handlers.environments.base import EnvironmentRecord
from grandrounds.handlers.llm.errors import ReplayDivergence
from grandrounds.handlers.llm.record import RecordedExchanges
from grandrounds.handlers.policies.config import PolicyConfig
from grandrounds.handlers.runs import RunMismatch, RunSpec, read_spec, spec_difference
from grandrounds.replay.caselog import case_log, require_spec, seeded_memory
from grandrounds.replay.environment import check_environment, recorded_environment, reopen_environment
from grandrounds.replay.counterfactual import derived_spec, is_counterfactual, variant_tag
from grandrounds.replay.execute import JobResult, RunJob, run_jobs
from grandrounds.replay.permutations import permutations
from grandrounds.replay.metrics import default_window, rolling_accuracy
from grandrounds.replay.stats import bootstrap_mean_ci, outcomes_of, summarise
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog


from grandrounds.handlers.backbones import RECORDED_BACKBONES as MODEL_BACKBONES  # registrations with recorded=True
"""Backbones that call a model: their runs are replayed from the source's recorded exchanges."""


class ReplayInputError(InvalidInput, ValueError):
    """Bad replay flags (exit code 2)."""


class PermutationDiverged(ReplayDivergence):
    """A replay run asked for an exchange the source's record does not hold (exit code 1)."""

    def __init__(self, message: str, run_id: str):
        self.run_id = run_id
        super().__init__(message)


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
    cases: list[Case | FhirCase]
    runs: list[PlannedRun]
    environment: EnvironmentRecord | None = None
    """A FHIR run's environment (rebuilt for the replay), None for an MCQ run."""

    @property
    def served_from_record(self) -> bool:
        """Whether the runs call a model, served from the source's recorded exchanges."""
        return self.spec.backbone in MODEL_BACKBONES


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
    environment = recorded_environment(store, source)
    if environment is not None:  # FHIR tasks: refuse up front when the files moved or changed
        check_environment(environment, source, source_spec.source, cases, what="replay", store=store)
    if backbone == "record" and source_spec.backbone in MODEL_BACKBONES:
        backbone = None  # model runs are always replayed through the record backend; keep the source's spec
    spec = derived_spec(source_spec, source, policy=policy, backbone=backbone, model=model,
                        ablations=ablations, sets=sets)
    if spec.backbone not in ("sim", *MODEL_BACKBONES):
        raise ReplayInputError(f"unknown backbone {spec.backbone!r} (available: sim, openai, record)")
    if spec.backbone != "sim" and source_spec.backbone not in MODEL_BACKBONES:
        raise ReplayInputError(
            f"run {source!r} used the {source_spec.backbone!r} backbone: it recorded no model exchanges to "
            f"serve, so its case log cannot be replayed with {spec.backbone!r}: replay it with --backbone sim "
            "(the default for a sim run)")
    if environment is not None and getattr(environment, "name", None) == "agentclinic":
        from grandrounds.handlers.environments.osce_run import SUPPORTED_POLICIES as OSCE_POLICIES

        if spec.policy.name not in OSCE_POLICIES:
            raise ReplayInputError(f"run {source!r} holds AgentClinic OSCE cases: policy {spec.policy.name!r} "
                                   f"does not handle them yet (use {' or '.join(OSCE_POLICIES)})")
    elif environment is not None:
        import grandrounds.handlers.environments.medagentbench.run as fhir_run

        supported = getattr(fhir_run, "SUPPORTED_POLICIES", None)
        if supported is not None and spec.policy.name not in supported:
            raise ReplayInputError(f"run {source!r} holds MedAgentBench FHIR tasks: policy {spec.policy.name!r} "
                                   f"does not handle them yet (use {' or '.join(supported)})")
    if tag is None and is_counterfactual(source_spec, spec):
        tag = variant_tag(spec, ablations)
    stem = f"{source}-{tag}" if tag else source
    seeded = seeded_memory(store, source)  # an offline-mode source: every replay starts from its memory
    runs = []
    if original:
        rid = f"{stem}-original"
        runs.append(PlannedRun(rid, None, None, RunJob(rid, spec, tuple(cases), seeded)))
    for p in permutations(len(cases), count, seed):
        rid = f"{stem}-perm{p.k}-s{seed}"
        runs.append(PlannedRun(rid, p.k, p.order_seed, RunJob(rid, spec, tuple(cases[i] for i in p.order), seeded)))
    for r in runs:  # a name taken by a different configuration is bad input, before anything runs
        existing = read_spec(store, r.run_id)
        if existing is not None and existing != spec:
            differs = spec_difference(existing.started_event(""), spec.started_event(""))
            raise RunMismatch(f"run {r.run_id!r} already exists with a different configuration: {differs}; "
                              "pass --tag NAME to name this replay's runs differently")
    return ReplayPlan(source, source_spec, spec, seed, tag, cases, runs, environment)


def execute_plan(store: EventStore, cache: EmbeddingCache, plan: ReplayPlan, workers: int = 1,
                 on_run: Callable[[PlannedRun, JobResult], None] | None = None, *,
                 live_fallthrough: bool = False, base_url: str | None = None, agent=None) -> dict:
    """Run (or reuse) every planned run; returns the DESIGN §8 replay object.

    For a model-backed plan, each run is served the source's recorded exchanges (a fresh copy
    per run), in this process (`workers` is then 1); `live_fallthrough` calls the model at
    `base_url` (else OPENAI_BASE_URL) for a request the record does not hold, instead of
    raising `PermutationDiverged`. `agent` (an agent run's callable, `--agent`): asked for a request the
    record does not hold (a permutation shows it other memory). A FHIR plan's environment is opened here, once, for all its runs
    (in this process: `workers` is then 1).
    """
    t0 = time.perf_counter()
    by_id = {r.run_id: r for r in plan.runs}
    options = None
    current: list[str] = []
    if plan.served_from_record:
        workers = 1

        def recorded_options(job: RunJob) -> dict:
            current.append(job.run_id)
            opts = {"recorded": RecordedExchanges.from_store(store, plan.source),
                    "live_fallthrough": live_fallthrough, "base_url": base_url}
            if agent is not None:
                opts.update(agent=agent, live_fallthrough=True)
            return opts

        options = recorded_options
    opened = nullcontext(None)
    if plan.environment is not None:
        workers = 1
        opened = reopen_environment(plan.environment, plan.source, plan.source_spec.source, plan.cases,
                                    what="replay", store=store)
    cache.adopt_run(store, plan.source)  # every permutation embeds with the source's recorded vectors
    try:
        with opened as environment:
            results = run_jobs(store, cache, [r.job for r in plan.runs], workers=workers,
                               on_done=(lambda j, res: on_run(by_id[j.run_id], res)) if on_run else None,
                               backbone_options=options, environment=environment)
    except ReplayDivergence as exc:
        if not current or isinstance(exc, PermutationDiverged):
            raise
        run_id = current[-1]
        raise PermutationDiverged(
            f"replay run {run_id!r} diverged from the record of run {plan.source!r}: {exc}. Nothing of "
            f"{run_id!r} was written. Pass --live-fallthrough (with --base-url URL or OPENAI_BASE_URL) to call "
            "the model for requests the record does not hold", run_id) from exc
    elapsed = time.perf_counter() - t0
    result = replay_result(store, plan, results, workers, elapsed)
    if plan.served_from_record:
        result["live_fallthrough"] = live_fallthrough
    if plan.environment is not None:
        result["environment"] = plan.environment.name
    return result


def replay_result(store: EventStore, plan: ReplayPlan, results: list[JobResult], workers: int,
                  elapsed: float) -> dict:
    runs = []
    window = default_window(len(plan.cases))
    for r, res in zip(plan.runs, results):
        results_of = outcomes_of(store, r.run_id)
        s = summarise(results_of)
        runs.append({
            "run_id": r.run_id, "k": r.k, "order_seed": r.order_seed,
            "accuracy": s["accuracy"], "correct": s["correct"], "cases": s["cases"],
            "fingerprint": res.fingerprint or store.fingerprint(r.run_id), "reused": res.processed == 0,
            "seconds": round(res.seconds, 3), "cumulative_accuracy": s["cumulative_accuracy"],
            "rolling_accuracy": rolling_accuracy(results_of, window),
        })
        if plan.served_from_record:
            runs[-1]["llm_calls"] = llm_calls(store, r.run_id)
    accs = [r["accuracy"] for r in runs]
    mean = sum(accs) / len(accs)
    std = math.sqrt(sum((a - mean) ** 2 for a in accs) / len(accs))
    source_stats = summarise(outcomes_of(store, plan.source))
    executed = sum(res.processed for res in results)
    out = {
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
        "accuracy_ci95": bootstrap_mean_ci(accs, plan.seed),
        "mean_curve": mean_curve([r["cumulative_accuracy"] for r in runs]),
        "rolling_window": window,
        "mean_rolling": mean_curve([r["rolling_accuracy"] for r in runs]),
        "workers": workers,
        "cases_executed": executed,
        "seconds": round(elapsed, 3),
        "cases_per_second": round(executed / elapsed, 1) if executed and elapsed > 0 else None,
    }
    if plan.served_from_record:
        out["served_from"] = plan.source
        out["llm_calls"] = {k: sum(r["llm_calls"][k] for r in runs) for k in ("recorded", "live")}
    return out


def llm_calls(store: EventStore, run_id: str) -> dict[str, int]:
    """The run's model exchanges (attempts) by how they were served: from the record, or live
    (a live run's calls, or live fall-through on a miss)."""
    counts = {"recorded": 0, "live": 0}
    for served, n in EventLog(store).meta_counts(run_id, "llm.exchange", "served").items():
        counts["recorded" if served == "record" else "live"] += int(n)
    return counts


def mean_curve(curves: list[list[float]]) -> list[float]:
    n = min(len(c) for c in curves) if curves else 0
    return [round(sum(c[i] for c in curves) / len(curves), 6) for i in range(n)]
