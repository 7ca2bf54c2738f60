"""The machine embedding cache: shared by every file and process, bit-for-bit vectors, never the
user's home folder in tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from conftest import ROOT
from grandrounds.store.embeddings import EmbeddingCache, MiniLMEmbedder
from grandrounds.store.eventstore import EventStore
from grandrounds.store.machine_cache import MachineEmbeddingCache, machine_cache


class CountingEmbedder:
    """Deterministic and machine-cacheable, counting how often the 'model' is asked."""

    name = "counting-8"
    dim = 8
    machine_cacheable = True

    def __init__(self) -> None:
        self.calls = 0

    def embed_one(self, text: str) -> np.ndarray:
        self.calls += 1
        rng = np.random.default_rng(abs(hash(text)) % 2**32)
        v = rng.standard_normal(8).astype(np.float32)
        return v / np.linalg.norm(v)


def test_tests_do_not_use_the_home_cache():
    cache = machine_cache()
    assert cache is not None
    assert not str(cache.path).startswith(str(Path.home() / ".cache"))


def test_a_new_file_gets_vectors_from_the_machine_cache_without_the_model(tmp_path):
    machine = MachineEmbeddingCache(tmp_path / "m")
    first = CountingEmbedder()
    with EventStore(tmp_path / "a.duckdb") as a:
        c = EmbeddingCache(first, a.conn, machine=machine)
        vecs = {t: c.get(t) for t in ("fever and cough", "chest pain", "rash")}
        c.flush()
    assert first.calls == 3
    second = CountingEmbedder()
    with EventStore(tmp_path / "b.duckdb") as b:  # another file: its own table is empty
        c = EmbeddingCache(second, b.conn, machine=MachineEmbeddingCache(tmp_path / "m"))
        for t, v in vecs.items():
            got = c.get(t)
            assert got.dtype == np.float32 and got.tobytes() == v.tobytes()  # bit for bit
        c.flush()
        assert second.calls == 0 and c.machine_hits == 3
        # and the file keeps what its runs used (it can be audited on another machine)
        assert b.conn.execute("SELECT count(*) FROM embedding_cache").fetchone()[0] == 3


def test_put_never_reaches_the_machine_cache(tmp_path):
    machine = MachineEmbeddingCache(tmp_path / "m")
    c = EmbeddingCache(CountingEmbedder(), None, machine=machine)
    c.put("synthetic", np.ones(8, dtype=np.float32))
    c.flush()
    assert machine.get(c.key("synthetic"), 8) is None


def test_test_doubles_are_not_shared_machine_wide():
    class Table:
        name, dim = "table-2", 2

        def embed_one(self, text):
            return np.zeros(2, dtype=np.float32)

    assert EmbeddingCache(Table()).machine is None
    assert EmbeddingCache(MiniLMEmbedder()).machine is not None


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from grandrounds.store.machine_cache import MachineEmbeddingCache
    m = MachineEmbeddingCache(sys.argv[1])
    w = int(sys.argv[2])
    for batch in range(20):
        rows = [(f"k{w}-{batch}-{i}", np.full(4, w + batch + i, dtype=np.float32)) for i in range(50)]
        rows.append(("shared", np.arange(4, dtype=np.float32)))
        m.put_many("m", rows)
        assert m.get("shared", 4).tobytes() == np.arange(4, dtype=np.float32).tobytes()
""")


def test_concurrent_processes_write_and_read_one_cache(tmp_path):
    folder = tmp_path / "m"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(w)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for w in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "could not write" not in err
    m = MachineEmbeddingCache(folder)
    for w in range(3):
        for batch in (0, 19):
            assert m.get(f"k{w}-{batch}-7", 4).tolist() == [w + batch + 7] * 4
    import sqlite3

    n = sqlite3.connect(m.path).execute("SELECT count(*) FROM vectors").fetchone()[0]
    assert n == 3 * 20 * 50 + 1


def test_an_unwritable_folder_turns_the_cache_off_instead_of_failing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    m = MachineEmbeddingCache(blocker / "sub")
    assert m.get("k", 4) is None and m.put_many("m", [("k", np.zeros(4, dtype=np.float32))]) == 0
