"""How `replay --workers N` starts its worker processes (`replay/execute.py: start_method`).

Forked workers start in milliseconds, spawned ones import grandrounds first (~0.5 s): the choice is
speed only. These tests pin the choice, its override, and that the runs are the same bytes either way.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.replay import execute
from grandrounds.store.errors import InvalidInput
from grandrounds.store.eventstore import EventStore
from replay_fixtures import db_copy, recorded_db  # noqa: F401

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is the default on Linux only")


def _embedder(loaded: bool):
    return lambda: SimpleNamespace(loaded=loaded)


@linux
def test_workers_fork_unless_the_embedding_model_is_loaded(monkeypatch):
    monkeypatch.delenv(execute.START_ENV, raising=False)
    monkeypatch.setattr(execute, "cache_embedder", _embedder(False))
    assert execute.start_method() == "fork"
    # torch's thread pool does not survive a fork: a process that loaded the model spawns instead
    monkeypatch.setattr(execute, "cache_embedder", _embedder(True))
    assert execute.start_method() == "spawn"


def test_the_environment_chooses_the_start_method_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setattr(execute, "cache_embedder", _embedder(False))
    monkeypatch.setenv(execute.START_ENV, "spawn")
    assert execute.start_method() == "spawn"
    monkeypatch.setenv(execute.START_ENV, "threads")
    with pytest.raises(InvalidInput, match="GRANDROUNDS_WORKER_START='threads'"):
        execute.start_method()


def test_a_bad_start_method_exits_2_and_writes_nothing(db_copy, monkeypatch):
    monkeypatch.setenv(execute.START_ENV, "threads")
    keys = db_copy.with_name(db_copy.name + ".keys")
    keys_before = keys.read_bytes() if keys.exists() else None
    with EventStore(db_copy, read_only=True) as store:
        before = [r.run_id for r in store.runs()]
    res = CliRunner().invoke(main, ["replay", "--db", str(db_copy), "--from", "src", "--permutations", "2",
                                    "--workers", "2", "--json"])
    assert res.exit_code == 2, res.output
    assert "GRANDROUNDS_WORKER_START" in res.output
    with EventStore(db_copy, read_only=True) as store:
        assert [r.run_id for r in store.runs()] == before
    assert (keys.read_bytes() if keys.exists() else None) == keys_before  # no subject keys made either


@linux
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_forked_and_spawned_workers_write_what_one_process_writes(db_copy, monkeypatch, method):
    monkeypatch.setenv(execute.START_ENV, method)
    started: list[str] = []
    real = execute.get_context
    monkeypatch.setattr(execute, "get_context", lambda m: started.append(m) or real(m))

    def replay(*args):
        res = CliRunner().invoke(main, ["replay", "--db", str(db_copy), "--from", "src", "--permutations", "2",
                                        "--seed", "5", *args, "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    one = replay("--workers", "1", "--tag", "one")
    two = replay("--workers", "2", "--tag", "two")
    assert started == [method] and two["workers"] == 2
    assert [r["fingerprint"] for r in two["runs"]] == [r["fingerprint"] for r in one["runs"]]
    with EventStore(db_copy, read_only=True) as store:
        for r in two["runs"]:
            assert store.verify_chain(r["run_id"]) is None
            # the fingerprint the worker reported is the one the file gives
            assert store.fingerprint(r["run_id"]) == r["fingerprint"]


def test_the_replay_process_checkpoints_each_workers_run_as_it_imports_it(db_copy, monkeypatch):
    """A worker's run lands in the file's WAL (~30 MB for 2,500 cases); left there, DuckDB checkpointed it
    at a later import or at close, after the last worker had finished. The replay process now
    checkpoints after each import (when the WAL is due), while the other workers still run."""
    from grandrounds.store import eventstore, recorder  # noqa: F401  (settings live on recorder)

    monkeypatch.setattr(recorder, "CHECKPOINT_AT", 1)  # every import is due (a test run's WAL is small)
    wal_after_import: list[int] = []
    real = EventStore.checkpoint_bounded

    def recording(self):
        ran = real(self)
        wal = self.path + ".wal"
        wal_after_import.append(os.path.getsize(wal) if os.path.exists(wal) else 0)
        return ran

    monkeypatch.setattr(EventStore, "checkpoint_bounded", recording)
    res = CliRunner().invoke(main, ["replay", "--db", str(db_copy), "--from", "src", "--permutations", "3",
                                    "--workers", "2", "--json"])
    assert res.exit_code == 0, res.output
    assert len(wal_after_import) >= 3  # one for each worker's run (the command may take one more at its end)
    assert all(size < 64 * 1024 for size in wal_after_import[:3]), wal_after_import
