"""Checkpoints that cannot hurt: a blob planted in the `checkpoints` table never runs code; anything
that is not a well-formed safe checkpoint of this very point of the log is dropped and rebuilt."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from grandrounds.app import make_cache, run_cases
from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import load_policy
from grandrounds.handlers.runs import RunSpec
from grandrounds.store import safe_codec
from grandrounds.store.eventstore import EventStore
from grandrounds.store.projection import PROJECTION_VERSION, checkpoint_of, open_projection, rebuild
from grandrounds.store.vector_index import VectorIndex

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "cases.jsonl"


class Planted:
    """Unpickling this runs `os.system`: it writes the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(db: Path, blob: bytes, version: int = PROJECTION_VERSION) -> None:
    with EventStore(db) as store:  # the row claims to be a checkpoint of the log's head
        seq, chain = store.head("r")
        store.conn.execute("UPDATE checkpoints SET data = ?, version = ?, seq = ?, chain = ? WHERE run_id = 'r'",
                           [blob, version, seq, chain])


@pytest.fixture
def run_db(tmp_path) -> Path:
    db = tmp_path / "run.duckdb"
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(EXAMPLES.read_text().splitlines(keepends=True)[:4]))
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(db), "--run-id", "r", "--json"])
    assert res.exit_code == 0, res.output
    return db


@pytest.mark.parametrize("version", [PROJECTION_VERSION, 2], ids=["current-version", "pickle-era-version"])
def test_a_planted_pickle_never_runs(run_db, tmp_path, version):
    marker = tmp_path / "pwned"
    _plant(run_db, pickle.dumps(Planted(marker)), version)
    pickle.loads(pickle.dumps(Planted(tmp_path / "control")))  # the blob does run code when unpickled
    assert (tmp_path / "control").exists()
    with EventStore(run_db) as store:
        opened = open_projection(store, "r", make_cache(store))
        assert opened.how.startswith("rebuild") and opened.projection.state == rebuild(store, "r", make_cache(store)).state
    # `run` resuming the run (what a worker start does too: open_run -> open_projection), and a replay
    cases = tmp_path / "cases.jsonl"
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(run_db), "--run-id", "r", "--json"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["replay", "--db", str(run_db), "--from", "r", "--permutations", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert not marker.exists()


def test_crafted_safe_format_blobs_are_refused(run_db, tmp_path):
    with EventStore(run_db) as store:
        good = bytes(store.conn.execute("SELECT data FROM checkpoints WHERE run_id = 'r'").fetchone()[0])
    header_len = int.from_bytes(good[len(safe_codec.MAGIC):len(safe_codec.MAGIC) + 8], "big")
    tree = json.loads(good[len(safe_codec.MAGIC) + 8:len(safe_codec.MAGIC) + 8 + header_len])
    tail = good[len(safe_codec.MAGIC) + 8 + header_len:]

    def blob(t) -> bytes:
        h = json.dumps(t).encode()
        return safe_codec.MAGIC + len(h).to_bytes(8, "big") + h + tail

    crafted = {
        "names os.system": dict(tree, **{"$o": "os:system"}),
        "names subprocess.Popen": dict(tree, **{"$o": "subprocess:Popen"}),
        "names a dunder path": dict(tree, **{"$o": "grandrounds.store.projection:MemoryProjection.__class__"}),
        "an object array": {"$id": 0, "$a": ["|O", [1], 0, 8]},
        "an array outside the buffer": {"$id": 0, "$a": ["<f4", [10**6], 0, 4 * 10**6]},
        "not a projection": {"$id": 0, "$l": []},
    }
    for why, t in crafted.items():
        if why != "not a projection":  # that one decodes (to a list): the projection check refuses it
            with pytest.raises(safe_codec.CheckpointFormatError):
                safe_codec.decode(blob(t))
        _plant(run_db, blob(t))
        with EventStore(run_db) as store:
            assert open_projection(store, "r", make_cache(store)).how.startswith("rebuild"), why


def test_a_crafted_hnswlib_graph_is_refused_before_hnswlib_sees_it():
    index = VectorIndex(8, exact_limit=4)
    rng = np.random.default_rng(0)
    for v in rng.normal(size=(40, 8)).astype(np.float32):
        index.add(v / np.linalg.norm(v))
    assert index.uses_hnsw
    params = index._hnsw.__getstate__()[0]
    assert safe_codec.decode(safe_codec.encode(index)).search(index.vector(3), 5) == index.search(index.vector(3), 5)
    bad_link = dict(params, data_level0=params["data_level0"].copy())
    row = bad_link["data_level0"].view(np.uint8)
    row[4:8] = np.frombuffer(np.uint32(10**6).tobytes(), np.uint8)  # node 0's first link: a node that does not exist
    for broken in (bad_link, dict(params, enterpoint_node=10**6), dict(params, size_data_per_element=1),
                   dict(params, link_lists=params["link_lists"][:-1])):
        with pytest.raises(safe_codec.CheckpointFormatError):
            safe_codec._hnsw_from(broken)


@pytest.mark.parametrize("policy", ["evo-medagent", "skemex", "selsm", "retrosum"])
def test_every_policy_memory_round_trips_through_the_checkpoint_format(policy):
    cases = load_cases(EXAMPLES)[0][:6]
    with EventStore(":memory:") as store:
        cache = make_cache(store)
        run_cases(store, cases, RunSpec(policy=load_policy(policy)), run_id="r", cache=cache)
        opened = open_projection(store, "r", cache)
        assert opened.how == "checkpoint"
        fresh = rebuild(store, "r", cache)
        assert opened.projection.state.counts() == fresh.state.counts()
        assert checkpoint_of(opened.projection).blob == checkpoint_of(fresh).blob
