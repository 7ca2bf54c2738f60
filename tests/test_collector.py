"""The embedded runner collects garbage less often (streams/collector.py): the same event bytes as with
the collector's defaults, the collector tuned while a run executes, and left as it was found after."""

from __future__ import annotations

import contextlib
import gc

import pytest

import grandrounds.streams.embedded as embedded
from grandrounds.streams.collector import YOUNG_THRESHOLD, fewer_collections


@pytest.fixture(autouse=True)
def _default_collector():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def _run(tmp_path, name: str, policy: str) -> tuple[str, list]:
    from grandrounds.app import run_cases
    from grandrounds.handlers.cases import load_cases
    from grandrounds.handlers.policies.config import load_policy
    from grandrounds.handlers.runs import RunSpec
    from grandrounds.store.embeddings import EmbeddingCache
    from grandrounds.store.eventstore import EventStore
    from tests.llm_helpers import HashEmbedder

    cases, _ = load_cases("examples/cases.jsonl")
    seen: list = []  # the collector's state at each case: proves which path ran
    with EventStore(tmp_path / f"{name}.duckdb") as store:
        cache = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        run_cases(store, cases, RunSpec(policy=load_policy(policy)), run_id="r", cache=cache,
                  on_case=lambda i, ok: seen.append((gc.get_threshold()[0], gc.get_freeze_count() > 0)))
        return store.fingerprint("r"), seen


@pytest.mark.parametrize("policy", ["evo-medagent", "selsm"])
def test_the_same_bytes_with_the_collectors_defaults(tmp_path, monkeypatch, policy):
    tuned, seen_tuned = _run(tmp_path, "tuned", policy)
    monkeypatch.setattr(embedded, "fewer_collections", contextlib.nullcontext)
    plain, seen_plain = _run(tmp_path, "plain", policy)
    assert tuned == plain
    assert set(seen_tuned) == {(YOUNG_THRESHOLD, True)} and set(seen_plain) == {(700, False)}
    assert gc.get_threshold()[0] == 700 and gc.get_freeze_count() == 0  # as found


def test_the_collector_is_restored_after_nested_blocks_and_errors():
    with fewer_collections():
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
        with pytest.raises(RuntimeError), fewer_collections():
            raise RuntimeError("a failing inner run")
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0  # the outer one still holds
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_an_owners_tuning_is_left_alone():
    gc.set_threshold(50_000, 20, 10)  # higher already: kept, and restored to it
    with fewer_collections():
        assert gc.get_threshold() == (50_000, 20, 10)
    assert gc.get_threshold() == (50_000, 20, 10) and gc.get_freeze_count() == 0
    gc.set_threshold(700, 10, 10)
    gc.disable()
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == 700 and gc.get_freeze_count() == 0
    finally:
        gc.enable()
    gc.freeze()  # the Kafka worker freezes its start-up heap for its life: not unfrozen by a run
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == 700
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def _child_runs_a_block(conn) -> None:
    with fewer_collections():
        pass
    conn.send("done")


def test_a_forked_child_does_not_inherit_a_held_lock():
    """Replay workers fork on Linux: a fork while another thread holds the collector's lock must not leave
    the child's first run waiting for it forever."""
    import multiprocessing
    import sys

    from grandrounds.streams import collector

    if not sys.platform.startswith("linux"):
        pytest.skip("fork start method")
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    with collector._lock:  # as if another thread were inside fewer_collections at the fork
        proc = ctx.Process(target=_child_runs_a_block, args=(child,))
        proc.start()
        got = parent.recv() if parent.poll(20) else None
    proc.join(5)
    if proc.is_alive():
        proc.kill()
    assert got == "done"
