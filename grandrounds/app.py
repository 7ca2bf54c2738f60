"""Composition root: wires store, embeddings, handlers and a transport into a job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from grandrounds.handlers.cases import Case
from grandrounds.handlers.llm.errors import ModelOutage
from grandrounds.handlers.runs import RunSpec
from grandrounds.replay.metrics import run_summary
from grandrounds.store.embeddings import Embedder, EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore
from grandrounds.streams.embedded import CommitMode, GroupCommit
from grandrounds.streams.session import Session


@dataclass
class RunOutcome:
    summary: dict
    processed_now: int
    projection_source: str
    note: str


def make_cache(store: EventStore, embedder: Embedder | None = None) -> EmbeddingCache:
    return EmbeddingCache(embedder or shared_minilm(), store.conn)


def unique_run_id(store: EventStore, base: str, spec: RunSpec) -> str:
    """The spec's default id; resumes a run with the same spec, never reuses a different one."""
    from grandrounds.handlers.runs import read_spec

    candidate, n = base, 1
    while store.has_run(candidate) and read_spec(store, candidate) != spec:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def run_cases(store: EventStore, cases: Sequence[Case], spec: RunSpec, run_id: str | None = None,
              cache: EmbeddingCache | None = None, commit: CommitMode = "group",
              on_case: Callable[[int, bool], None] | None = None,
              backbone_options: dict | None = None, seeded=None, environment=None,
              group: GroupCommit = GroupCommit()) -> RunOutcome:
    """`backbone_options` go to `make_backbone` (endpoint, recorded exchanges, ...): they
    choose how the backbone is reached, not what the run is, so they are not in the spec.
    `environment`: a tool-task environment (FHIR cases) the caller opened for the run; the spec
    names it by content (`spec.source`), and its record goes to the `run.started` meta."""
    cache = cache or make_cache(store)
    rid = run_id or unique_run_id(store, spec.default_run_id(), spec)
    session = Session.open(store, cache, rid, spec, cases=len(cases), backbone_options=backbone_options,
                           seeded=seeded, environment=environment, commit=commit, group=group)
    ctx = session.ctx
    try:
        processed = session.execute(cases, on_case=on_case)
    except ModelOutage as exc:
        # Not a result: the interrupted case's events were never written, so the same command
        # resumes at it. Say which run and how many cases are still to do.
        exc.run_id = rid
        exc.cases_left = len(cases) - ctx.projection.state.cases_completed
        raise
    finally:
        session.close()  # the cache's new vectors (the store is the caller's)
    how = session.how
    # The summary reads the whole run (its fingerprint): trimming DuckDB's cache as it goes keeps the
    # file's blocks from piling up; this process has the file to itself, on one thread.
    trim_scans, store.trim_scans = store.trim_scans, True
    try:
        summary = run_summary(store, rid, ctx.projection.state)
    finally:
        store.trim_scans = trim_scans
    store.checkpoint_bounded()  # the WAL's last part, bounded, rather than by DuckDB when the file closes
    found = getattr(ctx.writer.deidentifier, "found", None)
    if found:  # placeholders this process wrote into memory events, by type (none: the key is left out)
        from grandrounds.handlers.deidentify import PLACEHOLDERS

        summary["deidentified"] = {PLACEHOLDERS[k]: n for k, n in sorted(found.items())}
    if spec.backbone != "sim":
        from grandrounds.handlers.llm.usage import llm_usage
        from grandrounds.replay.task_metrics import EVENT_TYPES, task_metrics

        summary["llm"] = llm_usage(store, rid)
        # An answered, graded case whose reflection could not be obtained is not a failed case.
        failures = summary["llm"]["failed_cases"]
        summary["failed"] = sum(f["stage"] != "reflect" for f in failures)
        summary["reflections_failed"] = sum(f["stage"] == "reflect" for f in failures)
        if environment is not None and environment.name == "agentclinic":
            # the shortest OSCE dialogue is one turn: the diagnosis
            summary["metrics"] = task_metrics(store.iter(rid, types=EVENT_TYPES))
        elif environment is not None:
            from grandrounds.handlers.environments.medagentbench.run import fhir_task_class

            # T_min per task: `feedback.recorded.min_rounds` (refsol's branch); 2 where a task has none
            summary["metrics"] = task_metrics(store.iter(rid, types=EVENT_TYPES), t_min=2, classify=fhir_task_class)
        else:
            summary["metrics"] = task_metrics(store.iter(rid, types=EVENT_TYPES))
    if environment is not None and environment.name == "agentclinic":
        summary["environment"] = environment.name
    elif environment is not None:
        from grandrounds.handlers.environments.medagentbench.run import per_task_type

        summary["environment"] = environment.name
        summary["per_task_type"] = per_task_type(store, rid)
    return RunOutcome(summary, processed, how, ctx.backbone.note)


def default_db() -> Path:
    return Path("grandrounds.duckdb")
