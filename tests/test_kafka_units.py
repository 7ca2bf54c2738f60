"""Parts of the Kafka transport that need no broker: assignment plan, offsets, changelog codec,
URL parsing, the stage order the worker expects, and the committed AsyncAPI document."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from grandrounds.handlers.pipeline import CaseProgress
from grandrounds.store.eventstore import EventStore
from grandrounds.store.events import NewEvent
from grandrounds.store.event_types import CaseCompleted, RunStarted
from grandrounds.streams.assignor import copartition_plan
from grandrounds.streams.changelog import ChangelogImporter, batch_span, decode_batch, encode_batch
from grandrounds.streams.kafka_worker import Delivery, KafkaWorker, next_stage
from grandrounds.streams.offsets import PartitionOffsets
from grandrounds.streams.topics import BrokerUrlError, Topics, parse_broker_url, partition_for

ROOT = Path(__file__).resolve().parents[1]


def test_copartition_plan_gives_each_partition_number_to_one_worker():
    topics = Topics("x.").stages
    members = {f"{w}-{t}": w for w in ("wa", "wb") for t in topics}
    subs = {f"{w}-{t}": [t] for w in ("wa", "wb") for t in topics}
    plan = copartition_plan(members, subs, {t: range(8) for t in topics})
    owner = {}
    for member, assignment in plan.items():
        for topic, parts in assignment.items():
            for p in parts:
                assert owner.setdefault(p, members[member]) == members[member], "partition split across workers"
    assert sorted(owner) == list(range(8))
    assert {owner[p] for p in range(8)} == {"wa", "wb"}


def test_copartition_plan_leaves_a_missing_member_s_partitions_unassigned():
    # Worker b has joined with its retrieve consumer only: b's act partitions go to nobody.
    members = {"a-r": "a", "a-x": "a", "b-r": "b"}
    subs = {"a-r": ["r"], "a-x": ["x"], "b-r": ["r"]}
    plan = copartition_plan(members, subs, {"r": range(4), "x": range(4)})
    assert plan["a-x"]["x"] == [0, 2] and plan["b-r"]["r"] == [1, 3]


def test_partition_offsets_resume_at_the_first_unfinished_message():
    t = PartitionOffsets(10)
    for off in range(10, 15):
        t.delivered(off)
    t.done(11)
    t.done(13)
    assert t.watermark() == 10 and t.watermark(assuming_done=10) == 12
    t.done(10)
    assert t.watermark() == 12
    t.done(12)
    t.done(14)
    assert t.watermark() == 15 and t.pending == 0
    assert PartitionOffsets(None).watermark() == -1  # nothing known yet: nothing to store


def test_partition_offsets_with_messages_delivered_on_their_produce_ack():
    t = PartitionOffsets(10)
    t.delivered(10)
    assert t.delivered_own(12)  # produced by the worker, acknowledged at 12; 11 is not fetched yet
    assert t.watermark(assuming_done={10, 12}) == 11  # 11 may be another producer's message
    t.done(10)
    t.done(12)
    assert t.watermark() == 11
    assert t.delivered(11) and t.pending == 1
    assert not t.delivered(12) and t.pending == 1  # the consumer's copy of 12: not delivered again
    t.done(11)
    assert t.watermark() == 13 and t.pending == 0
    assert t.delivered_own(13) and t.delivered_own(14)  # right after the fetch position: contiguous
    t.done(13)
    assert t.watermark() == 14 and t.watermark(assuming_done=14) == 15
    t.delivered(15)  # the fetch may overtake the acknowledgement...
    assert not t.delivered_own(15)  # ...then the message was delivered by the consumer
    assert t.watermark(assuming_done={14, 15}) == 16
    fresh = PartitionOffsets(None)  # nothing fetched since the assignment: nothing to vouch for
    assert fresh.delivered_own(3) and fresh.watermark(assuming_done=3) == -1


def test_broker_urls():
    assert parse_broker_url("kafka://a:9092,b:9093") == "a:9092,b:9093"
    for bad in ("localhost:9092", "kafka://", "kafka://host", "memory"):
        with pytest.raises(BrokerUrlError):
            parse_broker_url(bad)


def test_partition_for_matches_java_default_partitioner():
    # Where the idempotent producer put these keys on a real 8-partition topic (murmur2, as Java).
    assert [partition_for(k, 8) for k in ("run-a", "run-b", "x")] == [2, 0, 6]


def _events(store: EventStore, run: str, n: int):
    store.append(run, [NewEvent(RunStarted(policy_name="none", policy={}, backbone="sim", seed=0,
                                           embedder="m"))], -1)
    for i in range(n):
        store.append(run, [NewEvent(CaseCompleted(index=i, correct=True), case_id=f"c{i}")], i)
    return store.read(run)


def test_a_changelog_message_is_the_same_whether_the_writer_or_a_reader_encodes_the_batch():
    # The worker encodes rows fresh from preview (payload JSON cached from the chain hash); collect
    # and restores re-encode rows read back from DuckDB (no cache). Same bytes, same events.
    store = EventStore(":memory:")
    fresh = store.preview("r", [NewEvent(RunStarted(policy_name="none", policy={"note": "ünïcode \"q\""},
                                                    backbone="sim", seed=0, embedder="m"))], -1)
    assert fresh[0].payload_json is not None
    store.append("r", [NewEvent(RunStarted(policy_name="none", policy={"note": "ünïcode \"q\""}, backbone="sim",
                                           seed=0, embedder="m"))], -1)
    read_back = store.read("r")
    assert read_back[0].payload_json is None
    assert encode_batch(fresh) == encode_batch(read_back)
    assert decode_batch(encode_batch(fresh)[0]) == read_back


def test_changelog_roundtrip_import_skips_what_is_there_and_refuses_gaps():
    src = EventStore(":memory:")
    events = _events(src, "r", 4)
    batches = [encode_batch(events[:2]), encode_batch(events[2:3]), encode_batch(events[3:])]
    assert batch_span(batches[0][1]) == ("r", 0, 1)
    assert decode_batch(batches[1][0]) == events[2:3]
    dst = EventStore(":memory:")
    dst.import_events(events[:1])  # already holds seq 0: the first batch is imported from seq 1 on
    imp = ChangelogImporter(dst)
    for value, headers in batches + batches:  # duplicates are skipped
        imp.add(headers, value)
    imp.flush()
    assert imp.tally.imported == {"r": 4} and not imp.tally.diverged
    assert dst.fingerprint("r") == src.fingerprint("r")
    gap = ChangelogImporter(EventStore(":memory:"))
    gap.add(batches[1][1], batches[1][0])
    gap.finish()
    assert "gap" in gap.tally.diverged["r"]


def test_a_batch_published_past_a_failed_one_is_skipped_until_the_steps_come_again_in_order():
    """A worker publishes a run's next batch before the previous one is acknowledged; when that one
    fails, the later batch lands alone and the worker publishes both again, in order, after it."""
    src = EventStore(":memory:")
    events = _events(src, "r", 4)
    first, lost, later = encode_batch(events[:2]), encode_batch(events[2:3]), encode_batch(events[3:])
    dst = EventStore(":memory:")
    imp = ChangelogImporter(dst)
    for value, headers in (first, later, lost, later):
        imp.add(headers, value)
    tally = imp.finish()
    assert tally.imported == {"r": len(events)} and not tally.diverged
    assert dst.fingerprint("r") == src.fingerprint("r")
    hole = ChangelogImporter(EventStore(":memory:"))
    for value, headers in (first, later):  # the lost batch never came again
        hole.add(headers, value)
    assert "gap" in hole.finish().diverged["r"]
    assert hole.tally.imported == {"r": 2}


def test_next_stage_follows_process_case():
    p = CaseProgress()
    assert next_stage(p) == "retrieve"
    p.memory = object()
    assert next_stage(p) == "act"
    p.answer = object()
    assert next_stage(p) == "feedback"
    p.feedback = object()
    assert next_stage(p) == "reflect"
    p.reflection = object()
    assert next_stage(p) == "govern"
    if hasattr(CaseProgress(), "failed"):  # a case whose act failed goes straight to govern
        q = CaseProgress()
        q.memory, q.failed = object(), object()
        assert next_stage(q) == "govern"


def test_committed_asyncapi_document_is_current():
    from grandrounds import __version__
    from grandrounds.streams.kafka_app import asyncapi_document

    committed = (ROOT / "docs" / "asyncapi.json").read_text(encoding="utf-8")
    assert committed == asyncapi_document("json", version=__version__), (
        "docs/asyncapi.json is stale: regenerate with `grandrounds asyncapi > docs/asyncapi.json`")


async def test_a_message_taken_up_ahead_of_its_ack_is_done_once_its_offset_is_known():
    """A step taken up before its command's ack can be finished (skipped, dropped) before the offset
    is known; the offset, registered when the ack comes, must not stay open and hold the position."""
    w = KafkaWorker(None, None, bootstrap="127.0.0.1:9", topics=Topics("t."), group_id="g", worker_id="w",
                    partitions=1)
    try:
        tracker = w.offsets[("t.act", 0)] = PartitionOffsets(0)
        sent = asyncio.get_running_loop().create_future()
        d = Delivery("act", None, "t.act", 0, None, 0, 0.0, (0, 1), own=True, sent=sent)

        def acked(fut):  # what RunActor._deliver_ahead registers first
            d.acknowledge(fut.result())
            tracker.delivered_own(d.offset)

        sent.add_done_callback(acked)
        w.finished(d)  # e.g. its step was dropped with a failed commit, before the ack
        assert tracker.watermark() == 0
        sent.set_result(0)
        await asyncio.sleep(0)
        assert tracker.pending == 0 and tracker.watermark() == 1
    finally:
        w.committer.close()


async def test_a_step_cancelled_by_a_revoke_drops_the_run_s_in_memory_state():
    """EventWriter.emit applies a stage's events to the projection as it goes: a step cancelled half way
    (a revoke past its timeout) must leave the run to be reopened from the log, not from that projection."""
    from grandrounds.streams.kafka_worker import RunActor

    w = KafkaWorker(None, None, bootstrap="127.0.0.1:9", topics=Topics("t."), group_id="g", worker_id="w",
                    partitions=1)
    try:
        actor = RunActor(w, "r", 0)
        actor.loaded, actor.ctx = True, object()  # a run whose projection saw part of a step
        started = asyncio.Event()

        async def half_a_step(d):
            started.set()
            await asyncio.sleep(3600)

        actor._process = half_a_step
        actor.next_key = lambda: (0, 1)
        actor.deliver(Delivery("act", None, "t.act", 0, 5, 0, 0.0, (0, 1)))
        await started.wait()
        generation = actor.generation
        actor.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await actor.task
        assert actor.ctx is None and not actor.loaded and actor.generation == generation + 1
    finally:
        w.committer.close()


async def test_worker_loads_the_embedding_model_before_it_joins_its_group(tmp_path, monkeypatch):
    """`grandrounds worker` loads MiniLM during start-up, before topics are ensured and the
    consumers join: a cold load inside the first case would block the loop past the heartbeat."""
    import grandrounds.streams.kafka_app as kafka_app
    import grandrounds.streams.session as session

    class Embedder:
        name, dim, machine_cacheable, loaded = "fake", 4, False, False

        def load(self):
            self.loaded = True

    class Joined(Exception):
        pass

    seen = []

    async def ensure_topics(*args, **kwargs):  # the first broker contact of the start-up
        seen.append(embedder.loaded)
        raise Joined

    embedder = Embedder()
    monkeypatch.setattr(session, "shared_minilm", lambda: embedder)  # the worker opens its store as every session
    monkeypatch.setattr(kafka_app, "ensure_topics", ensure_topics)
    for preload in (False, True):
        app = kafka_app.KafkaWorkerApp(kafka_app.WorkerSettings("127.0.0.1:1", db=str(tmp_path / f"w{preload}.duckdb"),
                                                                 preload_embedder=preload))
        with pytest.raises(Joined):
            await app._startup()
        app.store.close()
    assert seen == [False, True]


def test_a_worker_takes_agent_runs_of_its_own_agent_only():
    """`worker --agent REF --model NAME`: a run of the agent backbone is answered only by the agent it names
    (its spec's model); anything else is refused before the run is opened, never answered by another agent."""
    from grandrounds.handlers.backbones import BackboneUnavailable
    from grandrounds.handlers.policies.config import EvoMedAgentPolicy
    from grandrounds.handlers.runs import RunSpec

    sim_run = RunSpec(policy=EvoMedAgentPolicy())
    agent_run = sim_run.model_copy(update={"backbone": "agent", "model": "ward-agent"})
    mine = KafkaWorker(None, None, bootstrap="127.0.0.1:9", topics=Topics("t."), group_id="g", worker_id="w",
                       partitions=1, agent_name="ward-agent")
    none = KafkaWorker(None, None, bootstrap="127.0.0.1:9", topics=Topics("t."), group_id="g", worker_id="w",
                       partitions=1)
    try:
        mine.check_backbone("r", agent_run)
        mine.check_backbone("r", sim_run)  # sim runs: no agent involved
        none.check_backbone("r", sim_run)
        with pytest.raises(BackboneUnavailable, match="this worker's agent is 'ward-agent'"):
            mine.check_backbone("r", agent_run.model_copy(update={"model": "other-agent"}))
        with pytest.raises(BackboneUnavailable, match="no agent .*--agent module:callable --model ward-agent"):
            none.check_backbone("r", agent_run)
    finally:
        mine.committer.close()
        none.committer.close()


async def test_a_run_whose_state_is_dropped_has_its_session_closed():
    """Each run is a `Session` (streams/session.py); when the worker drops a run's state (a revoke, a reload,
    shutdown) the session's backbone is closed, and the worker's `close` waits for that."""
    from grandrounds.streams.kafka_worker import RunActor

    closed = []

    class Session:
        run_id = "r"
        ctx = object()

        async def aclose(self):
            await asyncio.sleep(0.01)
            closed.append(self)

    w = KafkaWorker(None, None, bootstrap="127.0.0.1:9", topics=Topics("t."), group_id="g", worker_id="w",
                    partitions=1)
    actor, dropped = RunActor(w, "r", 0), RunActor(w, "s", 0)
    first, second = Session(), Session()
    actor._adopt(first)
    dropped._adopt(second)
    assert actor.ctx is first.ctx
    actor.close(checkpoint=False)
    dropped.reload()
    assert actor.session is None and actor.ctx is None and dropped.session is None
    await w.close()
    assert closed == [first, second] or closed == [second, first]
    assert not w._releasing
