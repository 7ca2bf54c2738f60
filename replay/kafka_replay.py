"""Order-sensitivity replays executed by Kafka workers (`grandrounds replay --broker kafka://…`).

The plan is the local replay's (`order_replay.plan_replay`): the same run ids, specs and case
orders. Each planned run not already complete in the local file is submitted as an ordinary
Kafka run (its `RunStart`, then its cases in the permutation's order); the workers of the
consumer group process them (a run lives on one partition, so runs spread over the workers)
and the client follows the changelog into the local file until every run is complete. The
result is then computed from those events, by the same `replay_result` as a local replay:
the worker writes the bytes the embedded runner writes, so each permutation's fingerprint is
the one a local replay gives.

What the workers cannot run is refused up front (bad input): a model run served from its
recorded exchanges (the record lives in the local file), a FHIR or OSCE run (the environment
lives on this machine) and an offline-mode run that starts from a seeded memory.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from grandrounds.handlers.cases import Case
from grandrounds.handlers.runs import RunMismatch, read_spec, spec_difference
from grandrounds.replay.execute import JobResult, completed_cases
from grandrounds.replay.order_replay import PlannedRun, ReplayInputError, ReplayPlan, replay_result
from grandrounds.store.eventstore import EventStore
from grandrounds.streams.producer import follow_runs, submit_runs
from grandrounds.streams.topics import Topics


def check_kafka_plan(plan: ReplayPlan) -> None:
    """Refuse (exit 2) a plan whose runs a Kafka worker cannot execute as the local replay would."""
    why = None
    if plan.served_from_record:
        why = (f"run {plan.source!r} used a model ({plan.source_spec.backbone}): its replays are served from the "
               "exchanges recorded in this file, which the workers do not have; replay it locally, or pass "
               "--backbone sim")
    elif plan.environment is not None:
        why = (f"run {plan.source!r} holds {plan.environment.name} tool tasks: their environment is rebuilt on "
               "this machine from its recorded files; replay it locally")
    elif any(r.job.seeded is not None for r in plan.runs):
        why = (f"run {plan.source!r} starts from the memory of another run (offline mode): the Kafka worker "
               "starts every run empty; replay it locally")
    elif not all(type(c) is Case for c in plan.cases):
        why = f"run {plan.source!r} holds cases the Kafka worker does not take (only MCQ cases); replay it locally"
    if why:
        raise ReplayInputError(f"--broker: {why}")


def execute_plan_on_kafka(store: EventStore, plan: ReplayPlan, bootstrap: str, topics: Topics, *,
                          timeout: float | None = None,
                          on_run: Callable[[PlannedRun, JobResult], None] | None = None,
                          on_case: Callable[[int], None] | None = None,
                          on_stall: Callable[[str], None] | None = None) -> dict:
    """`execute_plans_on_kafka` for one plan."""
    return execute_plans_on_kafka(store, [plan], bootstrap, topics, timeout=timeout, on_run=on_run,
                                  on_case=on_case, on_stall=on_stall)[0]


def execute_plans_on_kafka(store: EventStore, plans: list[ReplayPlan], bootstrap: str, topics: Topics, *,
                           timeout: float | None = None,
                           on_run: Callable[[PlannedRun, JobResult], None] | None = None,
                           on_case: Callable[[int], None] | None = None,
                           on_stall: Callable[[str], None] | None = None) -> list[dict]:
    """Submit every planned run not yet complete in `store` (all plans at once: a replay and its
    baseline share the workers), follow them to the end, return each plan's DESIGN §8 replay object
    (as `execute_plan`, plus `broker`; `workers` is None: any number of workers of the group may
    have taken part).

    Raises `RunFailed` (a run dead-lettered; `RunRejected`, bad input, for a run id a worker holds
    with another configuration), `TimeoutError` past `timeout` seconds, and the Kafka client's
    errors when the broker is unreachable.
    """
    for plan in plans:
        check_kafka_plan(plan)
    t0 = time.perf_counter()
    results: dict[str, JobResult] = {}
    todo: dict[str, PlannedRun] = {}
    for r in (r for plan in plans for r in plan.runs):
        if r.run_id in results or r.run_id in todo:
            continue
        if completed_cases(store, r.run_id) >= len(r.job.cases):
            results[r.run_id] = JobResult(r.run_id, 0, 0.0)  # reused, as a local replay reuses it
            if on_run:
                on_run(r, results[r.run_id])
        else:
            todo[r.run_id] = r
    if todo:
        before = {rid: completed_cases(store, rid) for rid in todo}

        def done(run_id: str) -> None:
            # The run the workers hold under this id must be the one planned: a run of that id made with
            # another configuration (submitted by hand, say) can finish before the worker's dead letter
            # about this replay's RunStart arrives. The code versions are the worker's build.
            spec = todo[run_id].job.spec
            recorded = read_spec(store, run_id)
            if recorded is None or recorded.model_copy(update={"code": spec.code}) != spec:
                differs = "no run.started"
                if recorded is not None:
                    first = store.read(run_id, upto_seq=0)[0].decode()
                    asked = spec.model_copy(update={"code": recorded.code}).started_event(first.embedder, first.cases)
                    differs = spec_difference(first, asked)
                raise RunMismatch(f"run {run_id!r} rejected: the workers hold it with a different configuration: "
                                  f"{differs}; pass --tag NAME to name this replay's runs differently")
            results[run_id] = JobResult(run_id, len(todo[run_id].job.cases) - before[run_id],
                                        time.perf_counter() - t0, worker=True)
            if on_run:
                on_run(todo[run_id], results[run_id])

        async def go() -> None:
            submitted = await submit_runs(bootstrap, [(r.run_id, r.job.spec, r.job.cases) for r in todo.values()],
                                          topics)
            await follow_runs(bootstrap, submitted, store, topics, timeout=timeout, on_case=on_case, on_run=done,
                              on_stall=on_stall)

        asyncio.run(go())
    elapsed = time.perf_counter() - t0
    outs = []
    for plan in plans:
        out = replay_result(store, plan, [results[r.run_id] for r in plan.runs], None, elapsed)
        out["broker"] = f"kafka://{bootstrap}"
        out["topic_prefix"] = topics.prefix
        outs.append(out)
    return outs
