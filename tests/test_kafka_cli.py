"""`grandrounds worker / submit / run --broker kafka:// / collect` as processes, and SIGKILL crash recovery."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time

import pytest
from kafka_fixtures import (changelog_tail, grandrounds, kafka_broker, kafka_warm, spawn_worker,  # noqa: F401
                            stop_worker, unique_prefix)
from grandrounds.store.eventstore import EventStore
from grandrounds.streams.topics import Topics, partition_for

pytestmark = [pytest.mark.kafka]


def test_cli_run_over_kafka_equals_embedded(kafka_broker, kafka_warm, tmp_path):
    """worker + `run --broker kafka://` give the embedded runner's result; submit and collect agree."""
    boot = kafka_broker.bootstrap
    url = f"kafka://{boot}"
    prefix = "grandrounds."  # `run` takes the default prefix; no other test uses it
    worker = spawn_worker(boot, kafka_warm.worker_db(tmp_path), prefix, tmp_path / "worker.log")
    try:
        ref = kafka_warm.reference[0]
        res = grandrounds("run", str(kafka_warm.cases_file), "--broker", url, "--db", str(tmp_path / "client.duckdb"),
                          "--sim-tool", "ddx-lookup=0.85", "--json", timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout)
        assert out["fingerprint"] == ref["fingerprint"]
        assert (out["accuracy"], out["cases"], out["events"]) == (ref["accuracy"], ref["cases"], ref["events"])
        assert out["memory"] == ref["memory"]

        # The same run id with another configuration is refused like the embedded runner does
        # (exit 2, naming the field), never answered with the old run's result: from the file
        # that followed the first run, and from a new file (the worker's file holds the run).
        for client in ("client.duckdb", "other-client.duckdb"):
            again = grandrounds("run", str(kafka_warm.cases_file), "--broker", url, "--db", str(tmp_path / client),
                                "--run-id", out["run_id"], "--seed", "3", "--sim-tool", "ddx-lookup=0.85", "--json",
                                timeout=180)
            assert again.returncode == 2, (client, again.stdout[-2000:], again.stderr[-2000:])
            assert "seed recorded 0, asked 3" in json.loads(again.stdout)["error"]

        sub = grandrounds("submit", str(kafka_warm.cases_file), "--broker", url, "--run-id", "cli-submitted",
                          "--sim-tool", "ddx-lookup=0.85", "--json")
        assert sub.returncode == 0, sub.stderr
        info = json.loads(sub.stdout)
        assert info["run_id"] == "cli-submitted" and info["cases"] == len(kafka_warm.cases)
        assert info["partition"] == partition_for("cli-submitted", 8)

        audit = tmp_path / "audit.duckdb"
        deadline = time.monotonic() + 120
        while True:
            col = grandrounds("collect", "--broker", url, "--db", str(audit), "--json")
            assert col.returncode == 0, col.stderr
            runs = {r["run_id"]: r for r in json.loads(col.stdout)["runs"]}
            if runs.get("cli-submitted", {}).get("fingerprint") == ref["fingerprint"]:
                break
            assert time.monotonic() < deadline, runs
            time.sleep(1)
        assert runs[out["run_id"]]["fingerprint"] == ref["fingerprint"]

        bad = grandrounds("submit", str(kafka_warm.cases_file), "--broker", "localhost:9092", "--json")
        assert bad.returncode == 2 and "kafka://" in json.loads(bad.stdout)["error"]
    finally:
        assert stop_worker(worker) == 0, (tmp_path / "worker.log").read_text()[-3000:]


@pytest.mark.parametrize("lag", [0, 2])
async def test_sigkill_the_worker_at_random_points_then_resume(kafka_broker, kafka_warm, tmp_path, lag):
    """≥5 SIGKILLs mid-run; after restarts every case ran once and the fingerprint is the uninterrupted one.
    With lag 2, each restarted worker folds the pinned memory versions from its log: the fingerprint is
    the embedded `run --lag 2`'s (not lag 0's)."""
    from grandrounds.streams.producer import submit_run

    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    rng = random.Random(int(os.environ.get("GRANDROUNDS_CRASH_SEED", "4")))
    db = kafka_warm.worker_db(tmp_path)
    log = tmp_path / "worker.log"
    run_id = "crash-run"
    cases = kafka_warm.cases
    sub = await submit_run(boot, run_id, kafka_warm.spec_with(lag=lag), cases, topics=topics)
    tail = await changelog_tail(boot, topics, sub.partition)
    seen_completed: set[int] = set()
    batches = 0

    async def read_changelog(timeout_ms: int = 200) -> None:
        nonlocal batches
        for records in (await tail.getmany(timeout_ms=timeout_ms)).values():
            for rec in records:
                batches += 1
                body = json.loads(rec.value)
                for e in body["events"]:
                    if e["type"] == "case.completed":
                        seen_completed.add(e["payload"]["index"])

    kills = ready_before = 0
    worker = None
    try:
        # The static name makes a restarted worker rejoin the group at once.
        worker = spawn_worker(boot, db, prefix, log, name="crashy")
        while kills < 6:
            # A few batches into the new worker's work: a run of 40 cases takes it ~0.3 s, so waiting
            # for more would let it finish before the fifth kill.
            target = batches + rng.randint(1, 4)
            deadline = time.monotonic() + 90
            while batches < target and len(seen_completed) < len(cases):
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                assert worker.poll() is None, log.read_text()[-3000:]
                await read_changelog()
            if len(seen_completed) >= len(cases):
                break
            await asyncio.sleep(rng.random() * 0.01)
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            kills += 1
            print(f"SIGKILL #{kills} after {batches} changelog batches, {len(seen_completed)} cases complete")
            ready_before = log.read_text(errors="replace").count(" ready in ")
            worker = spawn_worker(boot, db, prefix, log, name="crashy")
        assert kills >= 5, f"the run finished after {kills} kills; use more cases"
        deadline = time.monotonic() + 120
        while len(seen_completed) < len(cases):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            assert worker.poll() is None, log.read_text()[-3000:]
            await read_changelog(500)
        # The killed worker may have logged the last cases before it died (a run goes on with its next
        # step before the changelog acknowledges the last): the new one must restore them into the file
        # before it is stopped, and a SIGTERM during its start-up would kill it outright.
        while log.read_text(errors="replace").count(" ready in ") <= ready_before:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            assert worker.poll() is None, log.read_text()[-3000:]
            await asyncio.sleep(0.1)
    finally:
        await tail.stop()
        if worker is not None:
            assert stop_worker(worker) == 0, log.read_text()[-3000:]

    ref = kafka_warm.reference[lag]
    assert kafka_warm.reference[2]["fingerprint"] != kafka_warm.reference[0]["fingerprint"]
    with EventStore(db, read_only=True) as store:
        assert store.fingerprint(run_id) == ref["fingerprint"]
        assert store.verify_chain(run_id) is None
        events = store.read(run_id)
        received = [e.case_id for e in events if e.type == "case.received"]
        completed = [e.case_id for e in events if e.type == "case.completed"]
        assert received == completed == [c.case_id for c in cases]  # each case once, in order
        rules = [e.payload["rule_id"] for e in events if e.type == "rule.added"]
        assert len(rules) == len(set(rules))
    # The changelog holds the same log, batch for batch, without gaps.
    with EventStore(tmp_path / "from-changelog.duckdb") as combined:
        from grandrounds.streams.producer import collect

        tally = await collect(boot, combined, topics)
        assert not tally.diverged
        assert combined.fingerprint(run_id) == ref["fingerprint"]
