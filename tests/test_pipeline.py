"""The five stages over the embedded runner with the sim backbone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import run_in
from grandrounds.handlers.cases import Case
from grandrounds.handlers.context import EventWriter, RunContext
from grandrounds.handlers.pipeline import case_progress, process_case
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.reflect import reflect
from grandrounds.handlers.runs import RunMismatch, RunSpec, open_run
from grandrounds.handlers.backbones.sim import SimBackbone
from grandrounds.handlers.tools import ToolBox
from grandrounds.store import event_types as ev
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore
from grandrounds.store.policy_memory import part_for
from grandrounds.store.projection import MemoryProjection, open_projection, rebuild
from grandrounds.streams.embedded import EmbeddedRunner


def test_memory_beats_the_memory_free_baseline_on_the_same_stream(example_cases, evo_spec, none_spec):
    s = EventStore(":memory:")
    evo = run_in(s, example_cases, evo_spec, "evo").projection.state
    none = run_in(s, example_cases, none_spec, "none").projection.state
    assert evo.cases_completed == none.cases_completed == len(example_cases)
    assert evo.correct >= none.correct + 20  # recurring patterns: memory must pay off
    assert none.policy_memory.rules == {} and none.policy_memory.episodes == {}
    assert len(evo.policy_memory.episodes) == len(example_cases) and evo.policy_memory.active_rules()
    # the baseline retrieved nothing on any case
    for e in s.iter("none", types=["memory.retrieved"]):
        assert e.payload["rules"] == [] and e.payload["episodes"] == []


def test_later_cases_answer_from_memory_learned_earlier(example_cases, evo_spec, store):
    run_in(store, example_cases, evo_spec)
    sources = [e.payload["source"] for e in store.iter("r", types=["answer.given"])]
    from_memory = [s.startswith(("rule:", "episode:")) for s in sources]
    assert sum(from_memory[:10]) <= 2  # nothing to remember yet
    assert sum(from_memory[-30:]) >= 24
    assert any(s.startswith("rule:") for s in sources) and any(s.startswith("episode:") for s in sources)


def test_act_never_sees_the_gold_answer(example_cases):
    case = example_cases[0]
    assert "answer" not in case.view().model_dump()
    other_gold = next(k for k in case.options if k != case.answer)
    twin = case.model_copy(update={"answer": other_gold})
    assert case.view() == twin.view()
    memory = ev.MemoryRetrieved(memory_seq=-1)
    bb = SimBackbone()

    def act_on(c: Case):
        return asyncio.run(bb.act(c.view(), memory, ToolBox(c, {}, 0), np.random.default_rng(0)))

    assert act_on(case) == act_on(twin)


def test_a_case_never_retrieves_memory_derived_from_itself(example_cases, evo_spec, store):
    first = example_cases[0]
    twin_pattern = example_cases[:14]
    run_in(store, twin_pattern + [first], evo_spec)
    last = [e for e in store.iter("r", types=["memory.retrieved"])][-1].payload
    assert all(ep["source_case_id"] != first.case_id for ep in last["episodes"])
    state = open_projection(store, "r", EmbeddingCache(shared_minilm())).projection.state.policy_memory
    own = {r.rule_id for r in state.rules.values() if first.case_id in r.derived_from}
    assert own and not own & {r["rule_id"] for r in last["rules"]}


def test_tool_governance_learns_reliable_and_unreliable_tools(example_cases, store):
    spec = RunSpec(policy=EvoMedAgentPolicy(), seed=0, tools={"good": 0.95, "bad": 0.1})
    state = run_in(store, example_cases, spec).projection.state.policy_memory
    assert state.tools["good"].label == "Trusted"
    assert state.tools["bad"].label == "Avoid"
    changes = [(e.payload["tool"], e.payload["new"]) for e in store.iter("r", types=["tool.label_changed"])]
    assert ("good", "Trusted") in changes and ("bad", "Avoid") in changes
    # once Avoid, the agent stops calling the tool
    avoid_at = next(e.seq for e in store.iter("r", types=["tool.label_changed"]) if e.payload["new"] == "Avoid")
    later_calls = [c for e in store.iter("r", after_seq=avoid_at, types=["answer.given"])
                   for c in e.payload["tool_calls"] if c["tool"] == "bad"]
    assert later_calls == []


class _ProposeSame:
    """A backbone that proposes the same new rule every time (exercises near-duplicate handling)."""

    name, model, note = "test", None, ""

    async def reflect(self, case, memory, answer, feedback):
        return ev.ReflectionRecorded(summary="s", guideline="g", edits=[
            ev.RuleEditProposal(op="add", text="If chest pain tears to the back: favour 'Aortic dissection'.",
                                trigger=["tearing"], priority=2)])


def test_near_duplicate_rules_escalate_priority_instead_of_duplicating(example_cases, store):
    cache = EmbeddingCache(shared_minilm())
    proj = MemoryProjection(cache.embedder.dim).bind(cache)
    proj.state.policy_memory = part_for("evo-medagent", cache.embedder.dim, 4096)  # what run.started creates
    ctx = RunContext("r", EvoMedAgentPolicy(), _ProposeSame(), proj, EventWriter(store, "r", proj), 0)
    answer = ev.AnswerGiven(answer="A", source="lexical")
    fb = ev.FeedbackRecorded(answer="A", gold="A", correct=True)
    mem = ev.MemoryRetrieved(memory_seq=-1)
    for case in example_cases[:3]:
        asyncio.run(reflect(ctx, case, mem, answer, fb))
    ctx.writer.flush()
    rules = proj.state.policy_memory.active_rules()
    assert len(rules) == 1 and rules[0].priority == 0  # 2 -> 1 -> 0
    types = [e.type for e in store.read("r")]
    assert types.count("rule.added") == 1 and types.count("rule.priority_changed") == 2


def test_rebuild_from_the_log_equals_the_live_projection(example_cases, evo_spec, store):
    live = run_in(store, example_cases, evo_spec).projection
    rebuilt = rebuild(store, "r", EmbeddingCache(shared_minilm()))
    assert rebuilt.state == live.state
    live, rebuilt = live.state.policy_memory, rebuilt.state.policy_memory
    embed = EmbeddingCache(shared_minilm()).get
    for case in example_cases[:10]:
        q = embed(case.question)
        assert rebuilt.rule_index.search(q, 5) == live.rule_index.search(q, 5)
        assert rebuilt.episode_index.search(q, 3) == live.episode_index.search(q, 3)


def test_hnsw_path_is_deterministic_and_survives_a_checkpoint(example_cases, evo_spec, store):
    from grandrounds.store.safe_codec import decode, encode

    run_in(store, example_cases, evo_spec)
    cache = EmbeddingCache(shared_minilm())
    a = rebuild(store, "r", cache, exact_limit=8).state.policy_memory
    b = rebuild(store, "r", cache, exact_limit=8).state.policy_memory
    assert a.episode_index.uses_hnsw and a.rule_index.uses_hnsw
    c = decode(encode(a))  # the checkpoint format, hnswlib graphs included
    exact = rebuild(store, "r", cache).state.policy_memory
    found = agreed = 0
    for case in example_cases[:20]:
        q = cache.get(case.question)
        assert a.episode_index.search(q, 3) == b.episode_index.search(q, 3) == c.episode_index.search(q, 3)
        # the graph is approximate: its nearest is brute force's, and nearly all of its top 3 are brute force's
        approx, brute = a.episode_index.search(q, 3), exact.episode_index.search(q, 3)
        assert approx[0] == brute[0]
        found += len({i for i, _ in approx} & {i for i, _ in brute})
        agreed += len(brute)
    assert found / agreed >= 0.95, (found, agreed)


def test_checkpoint_is_used_caught_up_or_dropped(example_cases, evo_spec, tmp_path):
    s = EventStore(tmp_path / "cp.duckdb")
    cache = EmbeddingCache(shared_minilm(), s.conn)
    run_in(s, example_cases[:20], evo_spec)
    opened = open_projection(s, "r", cache)
    assert opened.how == "checkpoint"
    # more cases after the checkpoint: it is caught up, not rebuilt
    ctx, _ = open_run(s, "r", evo_spec, cache)
    runner = EmbeddedRunner(ctx, commit="stage", checkpoint_every=0)
    runner_cases = example_cases[:25]

    async def five_more():
        for i in range(20, 25):
            await process_case(ctx, runner_cases[i], i, on_stage=runner._flush_stage)

    asyncio.run(five_more())
    caught = open_projection(s, "r", cache)
    assert caught.how == "checkpoint+catch-up"
    assert caught.projection.state == rebuild(s, "r", cache).state
    # a checkpoint that does not match the log is dropped
    s.conn.execute("UPDATE checkpoints SET chain = 'bogus'")
    assert open_projection(s, "r", cache).how.startswith("rebuild")
    s.conn.execute("DELETE FROM checkpoints")
    assert open_projection(s, "r", cache).how == "rebuild: no checkpoint"
    s.close()


class _Crash(Exception):
    pass


def test_a_run_interrupted_mid_case_resumes_to_the_same_fingerprint(example_cases, evo_spec, tmp_path):
    cases = example_cases[:16]
    ref = EventStore(":memory:")
    run_in(ref, cases, evo_spec)

    s = EventStore(tmp_path / "crash.duckdb")
    cache = EmbeddingCache(shared_minilm(), s.conn)
    ctx, _ = open_run(s, "r", evo_spec, cache)
    runner = EmbeddedRunner(ctx, commit="stage")
    stages_seen = []

    async def crash_after_act(stage):
        await runner._flush_stage(stage)
        stages_seen.append(stage)
        if len(stages_seen) == 5 * 9 + 2:  # case 9, after retrieve and act were committed
            raise _Crash()

    async def go():
        for i, case in enumerate(cases):
            await process_case(ctx, case, i, on_stage=crash_after_act)

    with pytest.raises(_Crash):
        asyncio.run(go())
    s.close()

    s = EventStore(tmp_path / "crash.duckdb")  # a new process, as far as the store is concerned
    cache = EmbeddingCache(shared_minilm(), s.conn)
    progress = case_progress(s, "r", cases[9].case_id)
    assert progress.answer is not None and progress.feedback is None
    ctx, how = open_run(s, "r", evo_spec, cache)
    assert how.startswith("rebuild") or how.startswith("checkpoint")
    asyncio.run(EmbeddedRunner(ctx).run(cases))
    assert s.fingerprint("r") == ref.fingerprint("r")
    s.close()


def test_resuming_with_another_configuration_is_refused(example_cases, evo_spec, store):
    run_in(store, example_cases[:3], evo_spec)
    with pytest.raises(RunMismatch, match="different configuration"):
        open_run(store, "r", RunSpec(policy=EvoMedAgentPolicy(), seed=7), EmbeddingCache(shared_minilm()))


def test_commit_per_case_gives_the_same_bytes_as_per_stage(example_cases, evo_spec):
    a, b = EventStore(":memory:"), EventStore(":memory:")
    run_in(a, example_cases[:20], evo_spec, commit="stage")
    run_in(b, example_cases[:20], evo_spec, commit="case")
    assert a.fingerprint("r") == b.fingerprint("r")
