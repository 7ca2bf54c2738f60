"""The record is the same on every machine (DESIGN §3): recorded embeddings, exact decision arithmetic.

- Every dot product the memory computes is of int8-valued vectors: the same integer whatever computes it
  (BLAS, a loop in any order, hnswlib's SIMD inner product), so cosines and rankings are too.
- The transcendentals that decide (Evo-MedAgent's UCB log, SkeMex's strength exp and learning-rate cos,
  BM25's idf) are computed in `decimal`: the same floats on any platform.
- A run records the vectors it used (`embeddings.recorded`); verify re-executes with them, so a log
  verifies whatever the embedder now answers (1-ulp noise, another model, none at all, no torch).
- Under each of ATEN_CPU_CAPABILITY=avx512, avx2 and default that this CPU can run (store/cpu_kernels.py;
  a kernel it lacks is skipped, naming the CPU), each with an empty embedding cache, the README's main
  job prints the fingerprint the README shows; a run exported under the best kernel verifies under
  `default`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
from decimal import Context, Decimal
from pathlib import Path

import hnswlib
import numpy as np
import pytest

from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import load_policy
from grandrounds.handlers.runs import RunSpec, open_run
from grandrounds.replay.export import load_jsonl
from grandrounds.replay.verify import verify_run
from grandrounds.store import exact_math
from grandrounds.store.cpu_kernels import KERNELS, machine_kernels
from grandrounds.store.embeddings import EmbeddingCache, MiniLMEmbedder, shared_minilm
from grandrounds.store.eventstore import EventStore
from grandrounds.store.vector_index import VectorIndex
from grandrounds.store.vectors import cosines, near_boundary, on_grid, quantize
from grandrounds.streams.embedded import EmbeddedRunner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "cases.jsonl"
README = ROOT / "README.md"


# --- exact arithmetic ------------------------------------------------------------------------------


def _int8_vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, 384))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return quantize(v).astype(np.float32)


def test_dot_products_of_quantized_vectors_are_the_same_integers_in_any_summation_order():
    rows, q = _int8_vectors(300, 1), _int8_vectors(1, 2)[0]
    blas = rows @ q
    exact = np.array([sum(int(a) * int(b) for a, b in zip(r, q)) for r in rows])
    perm = np.random.default_rng(3).permutation(384)
    shuffled = rows[:, perm] @ q[perm]
    pairwise = (rows.astype(np.float32) * q).sum(axis=1)  # numpy's pairwise (SIMD) reduction
    assert np.array_equal(blas, exact) and np.array_equal(shuffled, exact) and np.array_equal(pairwise, exact)
    # hnswlib's SIMD inner product ("ip": 1 - dot) sees the same integers
    index = hnswlib.Index(space="ip", dim=384)
    index.init_index(max_elements=300, ef_construction=50, M=8, random_seed=1)
    index.add_items(rows, np.arange(300), num_threads=1)
    labels, dists = index.knn_query(q.reshape(1, -1), k=10, num_threads=1)
    assert np.array_equal(1.0 - dists[0].astype(np.float64), exact[labels[0]].astype(np.float64))


def test_a_cosine_does_not_depend_on_the_order_of_the_components():
    rows, q = _int8_vectors(50, 4), _int8_vectors(1, 5)[0]
    perm = np.random.default_rng(6).permutation(384)
    assert np.array_equal(cosines(rows, q), cosines(rows[:, perm], q[perm]))
    assert cosines(q.reshape(1, -1), q)[0] == 1.0  # a vector's cosine with itself is exactly 1


def test_the_vector_index_ranks_the_same_with_hnsw_and_exact_search():
    rows, queries = _int8_vectors(600, 7), _int8_vectors(20, 8)
    exact, graph = VectorIndex(384, exact_limit=10_000), VectorIndex(384, exact_limit=100)
    for r in rows:
        exact.add(r)
        graph.add(r)
    assert graph.uses_hnsw and not exact.uses_hnsw
    for q in queries:
        a, b = exact.search(q, 5), graph.search(q, 5)
        assert a[0] == b[0]  # the best item and its cosine, bit for bit
        for (la, sa), (lb, sb) in zip(a, b):
            if la == lb:
                assert sa == sb


@pytest.mark.parametrize("x", [1.0, 2.5, 3.5, 10.5, 1000.5, 2**20 + 0.5, 7.25])
def test_ln_is_the_correctly_rounded_float(x):
    true = Context(prec=80).ln(Decimal(x))
    assert exact_math.ln(x) == float(true)
    assert abs(exact_math.ln(x) - math.log(x)) <= math.ulp(math.log(x))


@pytest.mark.parametrize("x", [-0.1, -0.25, -1.0, -1 / 3, -2.0, -7.5, -19.99])
def test_exp_is_the_correctly_rounded_float(x):
    assert exact_math.exp(x) == float(Context(prec=80).exp(Decimal(x)))
    assert abs(exact_math.exp(x) - math.exp(x)) <= math.ulp(math.exp(x))


def test_cos_of_a_fraction_of_pi_matches_the_true_value():
    for num, den in [(0, 20), (1, 20), (5, 20), (13, 20), (20, 20), (5, 3), (40, 20)]:
        got = exact_math.cos_pi_fraction(num, den)
        assert abs(got - math.cos(math.pi * num / den)) <= 2e-16, (num, den)
    with pytest.raises(ValueError):
        exact_math.cos_pi_fraction(-1, 5)


# --- the embedder's grid vectors -------------------------------------------------------------------


def test_grid_vectors_quantize_back_to_themselves_and_lie_far_from_every_boundary():
    q = quantize(_int8_vectors(5, 9) / 128.0)
    g = on_grid(q)
    assert np.array_equal(quantize(g), q) and not near_boundary(g)
    boundary = np.zeros(384, dtype=np.float32)
    boundary[0] = np.float32(0.5 / 128 + 2e-7)  # 2e-7 past a rounding boundary: too close to trust float32
    assert near_boundary(boundary)


def test_the_embedder_recomputes_in_float64_near_a_boundary(monkeypatch):
    emb = MiniLMEmbedder()
    text = "A 45-year-old presents with crushing chest pain radiating to the left arm."
    v = emb.embed_one(text)
    assert np.array_equal(quantize(v), quantize(v.astype(np.float64))) and v.dtype == np.float32
    assert np.array_equal(v * 128, np.rint(v * 128))  # on the grid
    # Push one component of the float32 vector onto a boundary: the float64 pass must decide it.
    real = emb._model.encode
    calls = []

    def nudged(texts, **kw):
        out = real(texts, **kw)
        out = np.array(out, dtype=np.float32)
        out[0][0] = np.float32(3.5 / 128)
        calls.append(1)
        return out

    import copy

    emb2 = MiniLMEmbedder()
    emb2._model = emb._model
    emb2._double = copy.deepcopy(emb._model).double()  # before the float32 model is nudged
    monkeypatch.setattr(emb._model, "encode", nudged)
    w = emb2.embed_one(text)
    monkeypatch.undo()
    assert calls and emb2.double_passes == 1
    assert np.array_equal(quantize(w), quantize(v))  # float64 gave back the true side of the boundary


# --- recorded vectors ------------------------------------------------------------------------------


class _Noisy:
    """MiniLM's vectors with 1-ulp noise on every component: another machine's kernels, exaggerated."""

    name = shared_minilm().name
    cache_name = shared_minilm().cache_name  # the same keys: the record's vectors are for this embedder
    dim = 384

    def embed_one(self, text):
        v = shared_minilm().embed_one(text)
        return np.nextafter(v, np.float32(np.inf)) if len(text) % 2 else np.nextafter(v, np.float32(-np.inf))


class _Refusing:
    """An embedder that must never be asked: every vector the log needs is in its record."""

    name = shared_minilm().name
    cache_name = shared_minilm().cache_name  # the same keys: the record's vectors are for this embedder
    dim = 384

    def embed_one(self, text):
        raise AssertionError(f"embedded a text the record lacks: {text[:80]!r}")


class _Shifted:
    """Another model altogether (a different vector for every text), same name: the record must win."""

    name = shared_minilm().name
    cache_name = shared_minilm().cache_name  # the same keys: the record's vectors are for this embedder
    dim = 384

    def embed_one(self, text):
        rng = np.random.default_rng(len(text))
        v = rng.normal(size=384).astype(np.float32)
        return v / np.linalg.norm(v)


def _recorded_run(policy: str, n: int = 40):
    cases = load_cases(EXAMPLES)[0][:n]
    store = EventStore(":memory:")
    cache = EmbeddingCache(shared_minilm(), store.conn, machine=None)
    ctx, _ = open_run(store, policy, RunSpec(policy=load_policy(policy), seed=0), cache, cases=len(cases))
    asyncio.run(EmbeddedRunner(ctx, commit="case").run(cases))
    return store


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["evo-medagent", "skemex", "selsm", "retrosum", "precedent"])
@pytest.mark.parametrize("embedder", [_Noisy, _Refusing, _Shifted], ids=["1ulp-noise", "no-embedder", "other-model"])
def test_a_recorded_log_verifies_identical_whatever_the_embedder_now_answers(policy, embedder):
    with _recorded_run(policy) as src:
        assert src.read(policy, types=["embeddings.recorded"]), "the run recorded no vectors"
        events = src.read(policy)
    with EventStore(":memory:") as store:
        store.import_events(events)
        result = verify_run(store, policy, EmbeddingCache(embedder(), store.conn, machine=None))
    assert result.identical and result.ok, result.reasons


@pytest.mark.slow
def test_without_its_recorded_vectors_a_noisy_embedder_is_seen():
    """The check can fail: the same log with its recorded vectors removed re-executes with the other
    model's vectors and diverges."""
    with _recorded_run("evo-medagent") as src:
        events = [e for e in src.read("evo-medagent")]
    from grandrounds.store.events import StoredEvent

    with EventStore(":memory:") as store:
        store.import_events(events)
        store.conn.execute("UPDATE events SET payload = ? WHERE type = 'embeddings.recorded'",
                           ['{"model": "none", "vectors": []}'])
        result = verify_run(store, "evo-medagent", EmbeddingCache(_Shifted(), store.conn, machine=None))
    assert not result.identical
    del StoredEvent


# --- across torch's CPU kernels, empty caches ------------------------------------------------------


def _grandrounds(args, cap, tmp_path, extra_env=None, cwd=None):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, "GRANDROUNDS_EMBEDDING_CACHE": str(tmp_path / f"cache-{cap}"),
           "OPENAI_BASE_URL": "", "OPENAI_API_KEY": "", **(extra_env or {})}
    exe = Path(sys.executable).with_name("grandrounds")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "grandrounds"]
    return subprocess.run(cmd + args, env=env, capture_output=True, text=True, timeout=900, cwd=cwd or tmp_path)


def _readme_fingerprint() -> str:
    block = README.read_text().split("<!-- example:run -->", 1)[1].split("<!-- /example -->", 1)[0]
    return re.search(r"fingerprint\s+([0-9a-f]{64})", block).group(1)


@pytest.mark.slow
@pytest.mark.parametrize("cap", KERNELS)
def test_the_readme_main_job_prints_the_readme_fingerprint_under_each_cpu_kernel(cap, tmp_path):
    kernels = machine_kernels()
    if kernels.skip_reason(cap):
        pytest.skip(kernels.skip_reason(cap))
    # In clear (GRANDROUNDS_ENCRYPT=0), so the export below opens in a fresh store without the key file;
    # the fingerprint covers the plaintext either way.
    proc = _grandrounds(["run", str(EXAMPLES), "--db", f"{cap}.duckdb", "--json"], cap, tmp_path,
                        extra_env={"GRANDROUNDS_ENCRYPT": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["fingerprint"] == _readme_fingerprint()
    if cap != kernels.best or cap == "default":
        return
    # A run made under the best kernel this CPU has (avx512 where it has AVX-512), exported, verifies under
    # `default` with an empty cache...
    exported = tmp_path / f"{cap}.jsonl"
    proc = _grandrounds(["export", "--all", "--db", f"{cap}.duckdb", "--out", str(exported)], cap, tmp_path,
                        extra_env={"GRANDROUNDS_ENCRYPT": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = load_jsonl(exported)
    assert any(e.type == "embeddings.recorded" for e in events)
    run_id = events[0].run_id
    check = ("import json, sys\n"
             "from grandrounds.replay.export import load_jsonl\n"
             "from grandrounds.replay.verify import verify_run\n"
             "from grandrounds.store.embeddings import EmbeddingCache, shared_minilm\n"
             "from grandrounds.store.eventstore import EventStore\n"
             f"events = load_jsonl({str(exported)!r})\n"
             "with EventStore(':memory:') as s:\n"
             "    s.import_events(events)\n"
             f"    r = verify_run(s, {run_id!r}, EmbeddingCache(shared_minilm(), s.conn))\n"
             "print(json.dumps({'identical': r.identical, 'reasons': r.reasons,\n"
             "                  'torch': sys.modules.get('torch') is not None}))\n")
    for blocked in (False, True):
        # ... and, torch made unimportable, still verifies: every vector it needs is in its record.
        # (a finder that refuses it, not sys.modules['torch'] = None: scipy, which the field de-identifier's
        # tool brings in, looks torch up in sys.modules and fails on a None entry)
        prog = ("import sys\nclass _NoTorch:\n    def find_spec(self, name, path=None, target=None):\n"
                "        if name == 'torch' or name.startswith('torch.'):\n"
                "            raise ImportError('torch is blocked here')\n"
                "sys.meta_path.insert(0, _NoTorch())\n" if blocked else "") + check
        proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "ATEN_CPU_CAPABILITY": "default",
                                   "GRANDROUNDS_EMBEDDING_CACHE": str(tmp_path / f"empty-{blocked}")})
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["identical"], out["reasons"]
        assert out["torch"] is False  # never loaded: the record held every vector
