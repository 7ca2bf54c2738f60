"""`--lag k` over Kafka with a live model (issue 17 item 7): the worker runs the next k cases of a run
ahead, as the embedded runner does (streams/lag.py `AheadPass`), so up to k+1 of them wait on the model
at once, and the run still has the embedded `run --lag k`'s events and fingerprint.

The pinning itself, SIGKILLs and takeovers of lagged runs are tested with `sim` in test_kafka_cli.py,
test_kafka_worker.py and test_kafka_replay.py; here the model is tests/fake_openai_server.py, slow and
answering in parallel, with replies coming back in shuffled order: a worker stopped and replaced
mid-run (fast), and worker processes SIGKILLed with cases ahead (slow: each process loads MiniLM).
"""

from __future__ import annotations

import asyncio
import json
import signal

import pytest
from fake_openai_server import FakeOpenAI
from kafka_fixtures import (changelog_tail, completed_cases, kafka_broker, kafka_warm,  # noqa: F401
                            running_worker, spawn_worker, stop_worker, unique_prefix, wait_until)
from llm_helpers import SECRET, live_options, openai_spec
from grandrounds.app import run_cases
from grandrounds.store.eventstore import EventStore
from grandrounds.streams.producer import follow_run, submit_run
from grandrounds.streams.topics import Topics

pytestmark = [pytest.mark.kafka]

LAG = 2
N = 8


def _served(store: EventStore, run_id: str, after_seq: int = -1) -> dict[str, int]:
    served: dict[str, int] = {}
    for e in store.iter(run_id, types=["llm.exchange"]):
        if e.seq > after_seq:
            served[e.meta["served"]] = served.get(e.meta["served"], 0) + 1
    return served


async def test_a_lagged_run_over_kafka_runs_ahead_and_equals_the_embedded_run(kafka_broker, kafka_warm, tmp_path):
    """One run, lag 2, stopped after a few cases and resumed by a new worker on the same file (which folds
    the pinned versions of the next cases from the log and sends them ahead): the embedded run's bytes."""
    cases = kafka_warm.cases[:N]
    spec = openai_spec().model_copy(update={"lag": LAG})
    db = kafka_warm.worker_db(tmp_path, "embedded")
    with FakeOpenAI(delay_s=0.05, jitter_s=0.05) as fake:  # jitter: concurrent replies come back shuffled
        def embedded() -> tuple[str, dict]:
            with EventStore(db) as store:
                out = run_cases(store, cases, spec, run_id="embedded", backbone_options=live_options(fake))
                return out.summary["fingerprint"], _served(store, "embedded")

        want, embedded_served = await asyncio.to_thread(embedded)  # a thread: run_cases has a loop of its own
        assert embedded_served.get("prefetched", 0) > 0
        fake.requests.clear()
        fake.max_in_flight = 0

        boot, prefix = kafka_broker.bootstrap, unique_prefix()
        topics = Topics(prefix)
        worker_db = kafka_warm.worker_db(tmp_path)
        async with running_worker(boot, worker_db, prefix, backbone_opts=live_options(fake)) as app:
            sub = await submit_run(boot, "lagged", spec, cases, topics=topics)
            await wait_until(lambda: completed_cases(app.store, "lagged") >= 3, 60, "3 cases done")
            first_in_flight = fake.max_in_flight
        with EventStore(worker_db) as s:  # the worker stopped (its cases ahead were cancelled)
            stopped_at, done = s.head("lagged")[0], completed_cases(s, "lagged")
        assert done < N, "the run ended before the restart: nothing left to resume"
        async with running_worker(boot, worker_db, prefix, backbone_opts=live_options(fake)) as app:
            client = EventStore(":memory:")
            await follow_run(boot, sub, client, topics=topics, timeout=120)
            await app.worker.committer.settle()
            assert client.fingerprint("lagged") == want  # never dependent on timing: the embedded run's bytes
            assert app.store.fingerprint("lagged") == want
            served, resumed = _served(app.store, "lagged"), _served(app.store, "lagged", stopped_at)
            client.close()
    # The worker's in-order pass was served what its ahead pass had fetched, before and after the
    # restart; several cases of the one run waited on the model at once; and a request was sent twice
    # only where a case's ahead pass was cut by the stop (at most the k+1 cases in flight, 2 calls each).
    assert served.get("prefetched", 0) > sum(served.values()) // 2, served
    assert resumed.get("prefetched", 0) > 0, resumed
    assert first_in_flight >= 2 and fake.max_in_flight >= 2
    assert sum(served.values()) <= len(fake.requests) <= sum(served.values()) + 2 * (LAG + 1)


@pytest.mark.slow
async def test_sigkills_of_a_worker_with_cases_ahead_leave_the_embedded_bytes(kafka_broker, kafka_warm, tmp_path,
                                                                               monkeypatch):
    """`grandrounds worker` processes SIGKILLed while cases of a lag-2 run wait on the model ahead: each
    restarted worker folds the pinned versions from its log and runs the next cases ahead again; what
    was fetched ahead and lost is asked again, and the run ends with the embedded run's fingerprint."""
    cases = kafka_warm.cases[:12]
    spec = openai_spec().model_copy(update={"lag": LAG})
    with FakeOpenAI(delay_s=0.1, jitter_s=0.05) as fake:
        def embedded() -> str:
            with EventStore(kafka_warm.worker_db(tmp_path, "embedded")) as store:
                return run_cases(store, cases, spec, run_id="embedded",
                                 backbone_options=live_options(fake)).summary["fingerprint"]

        want = await asyncio.to_thread(embedded)
        fake.max_in_flight = 0
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        boot, prefix = kafka_broker.bootstrap, unique_prefix()
        topics = Topics(prefix)
        db, log = kafka_warm.worker_db(tmp_path), tmp_path / "worker.log"
        sub = await submit_run(boot, "crashed", spec, cases, topics=topics)
        tail = await changelog_tail(boot, topics, sub.partition)
        completed: set[int] = set()

        async def until(n: int, worker) -> None:
            deadline = asyncio.get_running_loop().time() + 120
            while len(completed) < n:
                assert asyncio.get_running_loop().time() < deadline, log.read_text()[-3000:]
                assert worker.poll() is None, log.read_text()[-3000:]
                for records in (await tail.getmany(timeout_ms=200)).values():
                    for rec in records:
                        completed.update(e["payload"]["index"] for e in json.loads(rec.value)["events"]
                                         if e["type"] == "case.completed")

        worker = None
        try:
            for kill_at in (3, 7):  # with cases kill_at .. kill_at+2 in flight (ahead or in order)
                worker = spawn_worker(boot, db, prefix, log, name="crashy", extra=("--base-url", fake.base_url))
                await until(kill_at, worker)
                assert len(completed) < len(cases), "the run ended before the kill"
                worker.send_signal(signal.SIGKILL)
                worker.wait(10)
            worker = spawn_worker(boot, db, prefix, log, name="crashy", extra=("--base-url", fake.base_url))
            await until(len(cases), worker)
            # The last steps may be in the changelog before the file (a run goes on before the ack):
            # a SIGTERM stops the worker once it has committed what it processed.
        finally:
            await tail.stop()
            if worker is not None:
                assert stop_worker(worker) == 0, log.read_text()[-3000:]
    with EventStore(db, read_only=True) as store:
        assert store.fingerprint("crashed") == want
        events = store.read("crashed")
        assert [e.case_id for e in events if e.type == "case.completed"] == [c.case_id for c in cases]
        served = _served(store, "crashed")
    assert served.get("prefetched", 0) > 0 and fake.max_in_flight >= 2, served
