"""The Kafka transport against a real Apache Kafka broker, with workers in this process.

What must hold (DESIGN §4): a run over Kafka gives the embedded runner's exact events;
invalid messages go to the dead-letter topic and the worker goes on; a redelivered message
changes nothing; on assignment a worker resumes from the offsets stored in its DuckDB file;
a stage longer than max_poll_interval_ms costs no rebalance; several runs share a worker;
a second worker takes over a stopped one's runs from the changelog; the changelog builds a
combined database.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from kafka_fixtures import (completed_cases, kafka_broker, kafka_warm, run_ids_on_partitions,  # noqa: F401
                            running_worker, unique_prefix, wait_until)
from grandrounds.store.eventstore import EventStore
from grandrounds.store.projection import open_projection
from grandrounds.streams.changelog import batch_span
from grandrounds.streams.producer import collect, follow_run, submit_run
from grandrounds.streams.topics import Topics, partition_count, partition_for

pytestmark = [pytest.mark.kafka]


async def _read_all(bootstrap: str, topic: str, timeout: float = 10.0) -> list:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        parts = range(await partition_count(bootstrap, topic))
        tps = [TopicPartition(topic, p) for p in parts]
        assert tps, f"no partitions for {topic}"
        ends = await consumer.end_offsets(tps)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]] and loop.time() < deadline:
            for records in (await consumer.getmany(timeout_ms=300)).values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()


async def test_run_over_kafka_equals_embedded_and_stores_offsets(kafka_broker, kafka_warm, tmp_path):
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix) as app:
        sub = await submit_run(boot, "run-a", kafka_warm.spec, kafka_warm.cases, topics=topics)
        client = EventStore(tmp_path / "client.duckdb")
        await follow_run(boot, sub, client, topics=topics, timeout=90)
        await app.worker.committer.settle()  # the changelog leads the worker's file by a commit or so
        ref = kafka_warm.reference[0]
        assert client.fingerprint("run-a") == ref["fingerprint"]
        assert app.store.fingerprint("run-a") == ref["fingerprint"]
        assert app.store.verify_chain("run-a") is None
        # Each stage of each case ran exactly once, in order.
        steps = [s for s in app.worker.stats.step_log if s[0] == "run-a"]
        assert len(steps) == len(set(steps)) == 5 * len(kafka_warm.cases)
        assert [s[1] for s in steps] == sorted(s[1] for s in steps)
        await wait_until(lambda: app.worker.offsets[(topics.stage("govern"), sub.partition)].pending == 0, 10,
                         "last message done")
        # Every consumed message's position is in DuckDB, written with the events (or, for the
        # consumer's last copies, by the commit they schedule).
        p, n = sub.partition, len(kafka_warm.cases)
        stages = ("retrieve", "act", "feedback", "reflect", "govern")
        want = {(topics.stage(s), p): n + (s == "retrieve") for s in stages}  # retrieve: RunStart + the cases

        def stored() -> dict:
            got = app.store.consumer_offsets(prefix + "g")
            return {tp: got.get(tp) for tp in want}
        await wait_until(lambda: stored() == want, 10, "every position stored")
        assert app.worker.stats.skipped == 0 and app.worker.stats.dead_letters == 0
        # The worker owns every partition: it took each next stage up on the produce ack, and dropped
        # the consumer's copies of those commands (every command was delivered exactly once).
        stats = app.worker.stats
        assert stats.own_deliveries > 0
        await wait_until(lambda: stats.echoes >= stats.own_deliveries, 10, "the consumer's copies")
        assert stats.echoes == stats.own_deliveries
        assert sum(stats.processed.values()) == 5 * len(kafka_warm.cases)
        # The run ended with a checkpoint of its last event (written off the event loop, on the
        # commit thread): reopening it reads the checkpoint, no rebuild.
        await app.worker.committer.idle()
        head = app.store.head("run-a")
        opened = open_projection(app.store, "run-a", app.worker.cache)
        assert opened.how == "checkpoint" and opened.projection.seq == head[0]
        client.close()


async def test_invalid_messages_go_to_dead_letters_and_the_worker_goes_on(kafka_broker, kafka_warm, tmp_path):
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix) as app:
        producer = AIOKafkaProducer(bootstrap_servers=boot, acks="all", enable_idempotence=True)
        await producer.start()
        try:
            bad = [
                (topics.stage("retrieve"), b"run-bad", b"this is not json"),
                (topics.stage("retrieve"), b"run-bad", json.dumps({"kind": "case", "run_id": "run-bad"}).encode()),
                (topics.stage("act"), b"run-bad", json.dumps({"run_id": "run-bad", "index": -3, "case_id": "x"}).encode()),
                (topics.stage("govern"), b"another-key", json.dumps({"run_id": "run-bad", "index": 0,
                                                                      "case_id": "x"}).encode()),
            ]
            for topic, key, value in bad:
                await producer.send_and_wait(topic, value, key=key)
        finally:
            await producer.stop()
        await wait_until(lambda: app.worker.stats.dead_letters >= len(bad), 30, "dead letters")
        # ...and the worker still processes a valid run.
        n = 4
        sub = await submit_run(boot, "run-ok", kafka_warm.spec, kafka_warm.cases[:n], topics=topics)
        client = EventStore(":memory:")
        await follow_run(boot, sub, client, topics=topics, timeout=60)
        assert client.fingerprint("run-ok") == kafka_warm.fingerprint_upto(n)
    letters = [json.loads(r.value) for r in await _read_all(boot, topics.dead_letter)]
    assert len(letters) == len(bad)
    assert {x["reason"] for x in letters} == {"invalid"}
    by_value = {x["value"]: x for x in letters}
    assert "this is not json" in by_value
    assert all(x["error"] for x in letters)
    assert any("key" in x["error"] for x in letters)  # the mis-keyed message says why
    assert {x["source_topic"] for x in letters} == {topics.stage("retrieve"), topics.stage("act"),
                                                     topics.stage("govern")}


async def test_redelivery_changes_nothing_and_restart_resumes_from_duckdb_offsets(kafka_broker, kafka_warm, tmp_path):
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    db = kafka_warm.worker_db(tmp_path)
    cases = kafka_warm.cases[:6]
    ref = kafka_warm.fingerprint_upto(len(cases))
    async with running_worker(boot, db, prefix) as app:
        sub = await submit_run(boot, "run-r", kafka_warm.spec, cases, topics=topics)
        await follow_run(boot, sub, EventStore(":memory:"), topics=topics, timeout=60)
        await app.worker.committer.settle()
        events = app.store.last_seq("run-r")
        # Redeliveries: the whole run submitted again, and stale stage commands. Their positions have
        # no step to carry them into the file: the stop right after must still store them.
        app.worker.committer.linger = 30.0
        await submit_run(boot, "run-r", kafka_warm.spec, cases, topics=topics)
        stats = app.worker.stats
        await wait_until(lambda: stats.skipped >= len(cases) + 1, 30, "resubmitted messages skipped")
        assert app.store.last_seq("run-r") == events
        assert app.store.fingerprint("run-r") == ref
    # Rewind the group's committed offsets to 0: a worker that trusted Kafka's offsets would
    # redeliver everything; ours resumes from the offsets in its DuckDB file.
    rewind = AIOKafkaConsumer(bootstrap_servers=boot, group_id=prefix + "g", enable_auto_commit=False)
    await rewind.start()
    try:
        tps = [TopicPartition(t, sub.partition) for t in topics.stages]
        rewind.assign(tps)
        await rewind.commit({tp: 0 for tp in tps})
    finally:
        await rewind.stop()
    async with running_worker(boot, db, prefix) as app:
        await asyncio.sleep(3)  # time to receive anything it would redeliver
        assert app.worker.stats.skipped == 0
        assert sum(app.worker.stats.processed.values()) == 0
        assert app.store.last_seq("run-r") == events
    # A new group with the same file reads every topic from the start: all skipped.
    async with running_worker(boot, db, prefix, group_id=prefix + "fresh") as app:
        total = 1 + 2 * len(cases) + 4 * len(cases)  # RunStart, cases twice, four stage commands per case
        await wait_until(lambda: app.worker.stats.skipped >= total, 30, "full redelivery skipped")
        assert sum(app.worker.stats.processed.values()) == 0
        assert app.store.fingerprint("run-r") == ref


async def test_act_longer_than_max_poll_interval_costs_no_rebalance(kafka_broker, kafka_warm, tmp_path, monkeypatch):
    from grandrounds.handlers.backbones.sim import SimBackbone

    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    slow_case = kafka_warm.cases[1].case_id
    original = SimBackbone.act
    calls: list[str] = []

    async def slow_act(self, view, *args, **kwargs):
        calls.append(view.case_id)
        if view.case_id == slow_case:
            await asyncio.sleep(4.5)  # an LLM call outlasting max_poll_interval_ms (2 s)
        return await original(self, view, *args, **kwargs)

    monkeypatch.setattr(SimBackbone, "act", slow_act)
    n = 3
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix, max_poll_interval_ms=2000,
                              session_timeout_ms=6000, heartbeat_interval_ms=500) as app:
        # Start from a settled group (fresh topics can cost a rebalance while their metadata spreads).
        await wait_until(lambda: len(app.worker.owners) == 8 and all(len(v) == 5 for v in app.worker.owners.values()),
                         30, "all partitions of all five topics assigned")
        await asyncio.sleep(1.5)
        assignments, revocations = dict(app.worker.stats.assignments), dict(app.worker.stats.revocations)
        sub = await submit_run(boot, "run-slow", kafka_warm.spec, kafka_warm.cases[:n], topics=topics)
        await follow_run(boot, sub, EventStore(":memory:"), topics=topics, timeout=60)
        await app.worker.committer.settle()
        stats = app.worker.stats
        info = app.worker.summary()
        assert app.store.fingerprint("run-slow") == kafka_warm.fingerprint_upto(n)
        assert calls == [c.case_id for c in kafka_warm.cases[:n]], info  # each act exactly once
        assert stats.service_ms["act"].max > 4000, info
        assert dict(stats.revocations) == revocations, f"a rebalance happened: {info}"
        assert dict(stats.assignments) == assignments, info
        assert stats.skipped == 0, info


async def test_control_a_handler_that_awaits_the_slow_call_inline_does_lose_its_partitions(kafka_broker):
    """The control for the test above: the same settings, the slow call awaited in the handler."""
    import logging

    from faststream.kafka import KafkaBroker
    from faststream.middlewares import AckPolicy

    prefix = unique_prefix()
    revoked: list[set] = []

    class Listener:
        async def on_partitions_revoked(self, parts):
            if parts:
                revoked.append(set(parts))

        async def on_partitions_assigned(self, parts):
            pass

    broker = KafkaBroker(kafka_broker.bootstrap, log_level=logging.DEBUG, logger=logging.getLogger("control"))

    @broker.subscriber(prefix + "inline", group_id=prefix + "g", ack_policy=AckPolicy.MANUAL,
                       auto_offset_reset="earliest", max_poll_interval_ms=2000, session_timeout_ms=6000,
                       heartbeat_interval_ms=500, listener=Listener())
    async def handle(body: str) -> None:
        await asyncio.sleep(4.5)

    async with broker:
        await broker.start()
        await broker.publish("slow", prefix + "inline", key=b"k")
        await wait_until(lambda: revoked, 20, "the group to take the partition away")


async def test_parallel_runs_then_takeover_by_a_second_worker(kafka_broker, kafka_warm, tmp_path, monkeypatch):
    """Two workers share the group; one stops mid-way; the other finishes every run from the changelog."""
    from grandrounds.handlers.backbones.sim import SimBackbone

    original = SimBackbone.act

    async def model_call(self, view, *args, **kwargs):
        await asyncio.sleep(0.003)  # a stand-in for a model call: a run waiting on it lets the others go on
        return await original(self, view, *args, **kwargs)

    # Without any wait a run's steps take ~1 ms; a run whose cases were fetched first could then
    # finish before the next run's first case is fetched, and nothing would run in parallel.
    monkeypatch.setattr(SimBackbone, "act", model_call)
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    cases = kafka_warm.cases
    runs = run_ids_on_partitions([0, 1, 2, 3], stem="par")
    # Runs on partitions 0 and 1 (one on each worker) with lag 2: a lagged run taken over mid-run pins
    # the memory the embedded `run --lag 2` pins (the new owner folds it from the log).
    lags = {runs[0]: 2, runs[1]: 2}
    client = EventStore(":memory:")
    a_ctx = running_worker(boot, kafka_warm.worker_db(tmp_path, "a"), prefix, name=None)
    b_ctx = running_worker(boot, kafka_warm.worker_db(tmp_path, "b"), prefix, name=None)
    a = await a_ctx.__aenter__()
    try:
        b = await b_ctx.__aenter__()
        try:
            await wait_until(lambda: len(a.worker.owners) + len(b.worker.owners) == 8
                             and a.worker.owners and b.worker.owners, 60, "both workers assigned")
            # Submitted together, so the runs go at the same pace and are all under way when a stops.
            subs = await asyncio.gather(*(submit_run(boot, r, kafka_warm.spec_with(lag=lags.get(r, 0)), cases,
                                                     topics=topics) for r in runs))
            on_a = [r for r in runs if partition_for(r, 8) in a.worker.owners]
            assert on_a and len(on_a) < len(runs), "runs should be spread over both workers"
            # Stop worker a in the middle of its runs.
            await wait_until(lambda: all(completed_cases(a.store, r) >= 3 for r in on_a), 60, "runs under way")
            before = {r: completed_cases(a.store, r) for r in on_a}
            assert any(n < len(cases) for n in before.values()), "worker a finished too early to test a takeover"
            await a_ctx.__aexit__(None, None, None)
            a = None
            for sub in subs:
                await follow_run(boot, sub, client, topics=topics, timeout=120)
            # a may have logged a run's last steps before it stopped: b has them once it has restored
            # a's partitions, which the run's end in the changelog does not wait for.
            await wait_until(lambda: len(b.worker.owners) == 8 and all(t.done() for t in b.worker.takeovers.values()),
                             60, "b to take over every partition")
            await b.worker.committer.settle()
            for r in runs:
                want = kafka_warm.reference[lags.get(r, 0)]["fingerprint"]
                assert b.store.fingerprint(r) == want, r
                assert client.fingerprint(r) == want, r
            assert b.worker.stats.restored_events > 0
            # Several runs were in flight at once on b (they interleave in its step log).
            order = [s[0] for s in b.worker.stats.step_log]
            switches = sum(1 for x, y in zip(order, order[1:]) if x != y)
            assert switches > len(runs)
        finally:
            await b_ctx.__aexit__(None, None, None)
    finally:
        if a is not None:
            await a_ctx.__aexit__(None, None, None)
    # The changelog alone rebuilds every run: a combined audit database.
    with EventStore(tmp_path / "audit.duckdb") as audit:
        tally = await collect(boot, audit, topics)
        assert not tally.diverged
        for r in runs:
            assert audit.fingerprint(r) == kafka_warm.reference[lags.get(r, 0)]["fingerprint"]
            assert audit.verify_chain(r) is None
        again = await collect(boot, audit, topics)  # incremental: nothing new
        assert sum(again.imported.values()) == 0


def _wrap_step_commands(app, change):
    """Route the worker's per-step command produce (the one it takes up ahead of the ack) through `change`."""
    publish = app.worker.publish_stage

    async def publish_stage(stage, cmd, confirm=True):
        if confirm:
            return await publish(stage, cmd, confirm=True)  # a kick's re-produce: unchanged
        return await change(publish, stage, cmd)

    app.worker.publish_stage = publish_stage


async def test_a_run_takes_up_its_next_stage_before_the_ack_and_late_acks_change_nothing(kafka_broker, kafka_warm,
                                                                                         tmp_path):
    """The run goes on with its next stage as soon as the command is produced; the step is committed
    with the command's offset once known. With acks held back past the consumer's fetch, the
    consumer's copy comes first: it gives the step its offset and is not processed again."""
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    cases = kafka_warm.cases[:6]
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix) as app:
        loop = asyncio.get_running_loop()

        async def late(publish, stage, cmd):
            sent = await publish(stage, cmd, confirm=False)
            held = loop.create_future()

            def forward(f):
                loop.call_later(0.3, lambda: held.set_exception(f.exception()) if f.exception() else
                                held.set_result(f.result()))
            sent.add_done_callback(forward)
            return held

        _wrap_step_commands(app, late)
        sub = await submit_run(boot, "run-late", kafka_warm.spec, cases, topics=topics)
        await wait_until(lambda: completed_cases(app.store, "run-late") == len(cases), 60, "the run to finish")
        stats = app.worker.stats
        await wait_until(lambda: stats.echoes >= stats.own_deliveries, 10, "the consumer's copies")
        assert stats.early_copies > 0, "no copy came before its ack"
        assert app.store.fingerprint("run-late") == kafka_warm.fingerprint_upto(len(cases))
        steps = [s for s in stats.step_log if s[0] == "run-late"]
        assert len(steps) == len(set(steps)) == 5 * len(cases)
        assert stats.skipped == 0 and stats.dead_letters == 0
        # Every command's position is stored: none was left open by the early copies.
        await wait_until(lambda: all(t.pending == 0 for t in app.worker.offsets.values()), 10, "all done")
        await app.worker.committer.settle()
        await wait_until(lambda: app.store.consumer_offsets(prefix + "g").get((topics.stage("govern"), sub.partition))
                         == len(cases), 10, "the last position stored")
        stored = app.store.consumer_offsets(prefix + "g")
        for stage in ("act", "feedback", "reflect", "govern"):
            assert stored[(topics.stage(stage), sub.partition)] == len(cases)


async def test_a_command_the_broker_refuses_fails_the_steps_taken_up_ahead_and_the_run_recovers(kafka_broker,
                                                                                              kafka_warm, tmp_path):
    """The run took a stage up before its command was acknowledged; the broker never takes the command.
    The step (and any after it) is not committed: the run is reloaded and restored from the changelog,
    the command is produced again from the log, and the run ends as the embedded runner's."""
    from aiokafka.errors import KafkaTimeoutError

    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    cases = kafka_warm.cases[:6]
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix) as app:
        calls, refused = [0], []

        async def refuse_one(publish, stage, cmd):
            calls[0] += 1
            if calls[0] == 7 and not refused:  # a command in the middle of the run: not produced at all
                refused.append((stage, cmd.index))
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(KafkaTimeoutError())
                return fut
            return await publish(stage, cmd, confirm=False)

        _wrap_step_commands(app, refuse_one)
        await submit_run(boot, "run-lost", kafka_warm.spec, cases, topics=topics)
        await wait_until(lambda: completed_cases(app.store, "run-lost") == len(cases), 60, "the run to finish")
        await app.worker.committer.settle()
        assert refused, "no command was refused"
        assert app.store.fingerprint("run-lost") == kafka_warm.fingerprint_upto(len(cases))
        assert app.store.verify_chain("run-lost") is None
        stats = app.worker.stats
        assert stats.kicks >= 1  # the lost command came again from the log
        assert stats.dead_letters == 0  # nothing was wrong with any message


async def test_a_stage_that_fails_on_a_command_taken_up_ahead_goes_to_dead_letters_with_its_offset(
        kafka_broker, kafka_warm, tmp_path, monkeypatch):
    """act runs off a command the worker took up before its ack; when it raises, the dead letter
    names that command's topic and offset, and the worker goes on with other runs."""
    from grandrounds.handlers.backbones.sim import SimBackbone

    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    broken = kafka_warm.cases[2].case_id
    original = SimBackbone.act

    async def act(self, view, *args, **kwargs):
        if view.case_id == broken:
            raise RuntimeError("model endpoint down (test)")
        return await original(self, view, *args, **kwargs)

    monkeypatch.setattr(SimBackbone, "act", act)
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix) as app:
        sub = await submit_run(boot, "run-broken", kafka_warm.spec, kafka_warm.cases[:4], topics=topics)
        await wait_until(lambda: app.worker.stats.dead_letters == 1, 30, "the failed stage's dead letter")
        await wait_until(lambda: completed_cases(app.store, "run-broken") == 2, 10, "the cases before it")
        ok = await submit_run(boot, "run-fine", kafka_warm.spec, kafka_warm.cases[:2], topics=topics)
        await follow_run(boot, ok, EventStore(":memory:"), topics=topics, timeout=60)
    letters = [json.loads(r.value) for r in await _read_all(boot, topics.dead_letter)]
    assert len(letters) == 1
    letter = letters[0]
    assert letter["reason"] == "failed" and "model endpoint down" in letter["error"]
    assert letter["source_topic"] == topics.stage("act") and letter["partition"] == sub.partition
    acts = [r for r in await _read_all(boot, topics.stage("act")) if r.partition == sub.partition and r.key == b"run-broken"]
    assert [r.offset for r in acts if json.loads(r.value)["index"] == 2] == [letter["offset"]]


async def test_a_changelog_batch_the_broker_refuses_while_later_ones_land_leaves_no_gap(kafka_broker, kafka_warm,
                                                                                          tmp_path):
    """A run publishes its next batches before the broker acknowledges the last: when one batch is
    refused and later ones land, the run is restored and publishes the steps again in order; the
    worker's file and a changelog reader both skip the stray batches and end as the embedded run."""
    from aiokafka.errors import KafkaTimeoutError

    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    n = 6
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix) as app:
        publish = app.worker.publish_changelog
        calls, refused = [0], []

        async def refuse_one(batch, confirm=True):
            calls[0] += 1
            if calls[0] == 9 and not confirm and not refused:  # mid-run; the batches after it go out
                refused.append(batch[0].seq)
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(KafkaTimeoutError())
                return fut
            return await publish(batch, confirm=confirm)

        app.worker.publish_changelog = refuse_one
        await submit_run(boot, "run-hole", kafka_warm.spec, kafka_warm.cases[:n], topics=topics)
        await wait_until(lambda: completed_cases(app.store, "run-hole") == n, 60, "the run to finish")
        await app.worker.committer.settle()
        assert refused, "no batch was refused"
        assert app.store.fingerprint("run-hole") == kafka_warm.fingerprint_upto(n)
        assert app.store.verify_chain("run-hole") is None
        assert app.worker.stats.commit_failures >= 1 and app.worker.stats.dead_letters == 0
    spans = [batch_span(r.headers) for r in await _read_all(boot, topics.changelog)]
    firsts = [first for run, first, _ in spans if run == "run-hole"]
    assert refused[0] not in firsts[:firsts.index(refused[0])]  # the refused batch came later...
    assert max(firsts[:firsts.index(refused[0])]) > refused[0]  # ...after batches past it landed
    with EventStore(tmp_path / "audit.duckdb") as audit:
        tally = await collect(boot, audit, topics, run_ids=["run-hole"])
        assert not tally.diverged
        assert audit.fingerprint("run-hole") == kafka_warm.fingerprint_upto(n)


async def test_a_refused_duckdb_commit_reloads_the_run_and_restores_it_from_the_changelog(kafka_broker, kafka_warm,
                                                                                          tmp_path):
    """The file lags the changelog (commits are grouped and off the run's path): when DuckDB refuses a
    transaction, the run is reloaded from the file and restored from the changelog, and ends the same."""
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    n = 6
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix) as app:
        store = app.store
        append_prepared = store.append_prepared
        refused: list[int] = []
        feedbacks = [0]

        def flaky(batches, consumed=()):
            seen = sum(1 for _, rows, _ in batches for e in rows if e.type == "feedback.recorded")
            if not refused and feedbacks[0] < 3 <= feedbacks[0] + seen:
                refused.append(len(batches))
                raise RuntimeError("disk full (test)")
            feedbacks[0] += seen
            return append_prepared(batches, consumed)

        store.append_prepared = flaky  # the committer's thread calls it through the instance
        sub = await submit_run(boot, "run-f", kafka_warm.spec, kafka_warm.cases[:n], topics=topics)
        # A client following the run sees it through: a refused commit is no failed message.
        client = EventStore(":memory:")
        await follow_run(boot, sub, client, topics=topics, timeout=60)
        assert client.fingerprint("run-f") == kafka_warm.fingerprint_upto(n)
        await wait_until(lambda: completed_cases(store, "run-f") == n, 60, "the run to finish")
        await app.worker.committer.settle()
        assert refused, "no commit was refused"
        assert store.fingerprint("run-f") == kafka_warm.fingerprint_upto(n)
        assert store.verify_chain("run-f") is None
        stats = app.worker.stats
        assert stats.commit_failures == 1 and stats.dead_letters == 0 and stats.failed == 0
        assert stats.restored_events > 0  # its batch (and any after it) came back from the changelog
        # Every message is done, those of the dropped steps included (some were taken up ahead of their
        # ack): no offset is left open below the positions the worker stores.
        await wait_until(lambda: all(t.pending == 0 for t in app.worker.offsets.values()), 10, "every message done")


async def test_a_takeover_that_fails_once_is_retried_and_no_valid_message_is_dead_lettered(kafka_broker, kafka_warm,
                                                                                           tmp_path, monkeypatch):
    """A refused DuckDB commit makes the worker restore run a's partition from the changelog; that restore
    fails once (the changelog unreachable for a moment), while run b's messages arrive on the same
    partition and wait for it. The takeover is retried and both runs end as the embedded ones. (The
    takeover's exception used to reach the messages waiting on it: b's went to the dead letters.)"""
    import grandrounds.streams.kafka_worker.rebalance as rebalance

    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    n = 3
    run_a, run_b = run_ids_on_partitions([3, 3], stem="takeover")
    real_import, refused, import_failures, subs = rebalance.import_partitions, [], [], {}

    async def flaky_import(*args, **kwargs):
        if refused and not import_failures:
            import_failures.append(1)
            subs[run_b] = await submit_run(boot, run_b, kafka_warm.spec, kafka_warm.cases[:n], topics=topics)
            await asyncio.sleep(2.0)  # b's messages are fetched meanwhile: they wait for this takeover
            raise ConnectionError("changelog unreachable (test)")
        return await real_import(*args, **kwargs)

    monkeypatch.setattr(rebalance, "import_partitions", flaky_import)
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix) as app:
        store = app.store
        append_prepared = store.append_prepared
        feedbacks = [0]

        def flaky_commit(batches, consumed=()):
            seen = sum(1 for run, rows, _ in batches for e in rows if e.type == "feedback.recorded" and run == run_a)
            if not refused and feedbacks[0] < 2 <= feedbacks[0] + seen:
                refused.append(1)
                raise RuntimeError("disk full (test)")
            feedbacks[0] += seen
            return append_prepared(batches, consumed)

        store.append_prepared = flaky_commit
        subs[run_a] = await submit_run(boot, run_a, kafka_warm.spec, kafka_warm.cases[:n], topics=topics)
        await wait_until(lambda: run_b in subs, 60, "the restore to be attempted")
        for run_id in (run_a, run_b):
            client = EventStore(":memory:")
            await follow_run(boot, subs[run_id], client, topics=topics, timeout=60)  # a dead letter raises RunFailed
            assert client.fingerprint(run_id) == kafka_warm.fingerprint_upto(n)
        await wait_until(lambda: completed_cases(store, run_b) == n, 60, "the runs to finish")
        assert store.fingerprint(run_a) == store.fingerprint(run_b) == kafka_warm.fingerprint_upto(n)
        stats = app.worker.stats
        assert stats.takeover_failures == 1 and stats.dead_letters == 0 and stats.failed == 0
    assert await _read_all(boot, topics.dead_letter) == []


async def test_the_worker_signs_the_head_of_a_run_it_completes(kafka_broker, kafka_warm, tmp_path):
    """With a signing key configured (GRANDROUNDS_SIGNING_KEY or --key-file), the worker signs a completed
    run's head as the embedded runner does; `verify --key-file` then checks it against the log."""
    from grandrounds.store.signing import SigningKey, check_head

    key = SigningKey(b"k" * 32, "test")
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    topics = Topics(prefix)
    n = 2
    async with running_worker(boot, kafka_warm.worker_db(tmp_path), prefix, signing_key=key) as app:
        store = app.store
        await submit_run(boot, "run-s", kafka_warm.spec, kafka_warm.cases[:n], topics=topics)
        await wait_until(lambda: app.worker.stats.signed_heads == 1, 60, "the run's head signed")
        assert store.fingerprint("run-s") == kafka_warm.fingerprint_upto(n)
        assert check_head(store, "run-s", key).status == "valid"
        assert check_head(store, "run-s", SigningKey(b"x" * 32, "other")).status != "valid"
