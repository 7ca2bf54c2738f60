"""`recall` latency at 10k memory items: the Python API and the HTTP API, side by side in one run.

    python benchmarks/bench_api_recall.py [--items 10000] [--recalls 200] [--out benchmarks/results/api_recall.json]

A namespace of the `agent` backbone is seeded with --items synthetic memory items (half Evo-MedAgent rules,
half episodes, seeded random unit vectors: the machinery's cost, not embedding quality, as bench_core.py).
Each measured recall reads memory for a new case and opens it; `cancel` then drops it (nothing written), so
every recall does the full retrieval. Query questions are the example cases, each marked as its k-th
repeat, recalled once untimed before timing (a warm embedding cache, as DESIGN §9's per-case numbers; a new text
costs one MiniLM embedding, ~24 ms here, on top). HTTP: a real uvicorn server on 127.0.0.1 in this process
and an httpx client with a kept-alive connection (token checked on every request).
mem0's `search` (infer=False) side by side, when mem0ai is installed (`pip install -e ".[bench,mem0]"`):
the same memory texts with the same vectors, the same query texts, mem0's default local Qdrant store
(benchmarks/mem0_search.py says how it is set up offline and fair: neither side embeds while timed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import mem0_search  # noqa: E402
from benchmarks.bench_core import synthetic_memory  # noqa: E402
from benchmarks.common import bench_dir, peak_rss_mb, repeated_cases, seed_run  # noqa: E402
from grandrounds.api import AsyncMemory, MemoryHub, NamespaceConfig, _spec  # noqa: E402
from grandrounds.handlers.cases import load_cases  # noqa: E402

NS = "bench-recall"


def summary(seconds: list[float]) -> dict:
    ms = sorted(x * 1000 for x in seconds)
    return {"p50": round(statistics.median(ms), 3), "p90": round(ms[int(0.9 * len(ms))], 3),
            "p99": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 3), "mean": round(statistics.fmean(ms), 3),
            "n": len(ms)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--recalls", type=int, default=200)
    ap.add_argument("--mem0-top-k", type=int, default=10, help="mem0 search's top_k")
    ap.add_argument("--no-mem0", action="store_true", help="leave mem0 out even where it is installed")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "api_recall.json"))
    args = ap.parse_args()

    db = bench_dir("gr-api-recall-") / "bench.duckdb"
    hub = MemoryHub(db)
    spec = _spec("evo-medagent", "agent", 0, None)
    events, vectors = synthetic_memory(args.items, np.random.default_rng(0))
    for text, vec in vectors.items():
        hub.cache.put(text, vec)
    seed_run(hub.store, NS, spec, hub.cache, events)
    base = load_cases(ROOT / "examples" / "cases.jsonl")[0]
    cases = [c.model_dump(mode="json", exclude={"answer"}) for c in repeated_cases(base, args.recalls)]
    for c in cases:
        hub.cache.get(c["question"])  # warm: the query texts embedded once, before timing
    hub.cache.flush()

    loop = asyncio.new_event_loop()
    t = time.perf_counter()
    memory = loop.run_until_complete(hub.open(NS, NamespaceConfig()))
    open_s = time.perf_counter() - t

    async def python_recalls(batch: list[dict]) -> tuple[list[float], int]:
        times, shown = [], 0
        for c in batch:
            t0 = time.perf_counter()
            r = await memory.recall(c)
            times.append(time.perf_counter() - t0)
            shown += len(r.items)
            await memory.cancel(c["case_id"])
        return times, shown

    # Warm: one untimed recall of every case embeds the texts retrieval really queries (the question as
    # de-identified for retrieval, which is not the raw question the loop above embedded).
    loop.run_until_complete(python_recalls(cases))
    hub.cache.flush()
    import httpx
    import uvicorn

    from grandrounds.http_api import build_app, listening_socket

    sock = listening_socket("127.0.0.1", 0)  # TCP_NODELAY, as `grandrounds serve` binds
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(hub, "bench-token"), log_level="warning"))
    # The HTTP server needs the memory on its own loop: reopen it there.
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    loop.run_until_complete(memory.aclose())
    hub._open.clear()
    thread.start()
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer bench-token"},
                        timeout=60)
    for _ in range(600):
        try:
            if http.get("/health").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    http.put(f"/v1/namespaces/{NS}", json={}).raise_for_status()
    http_times: list[float] = []
    for c in cases[: args.recalls]:  # the same cases as the Python API's below: cancelled, so recallable again
        t0 = time.perf_counter()
        r = http.post(f"/v1/namespaces/{NS}/recall", json=c)
        http_times.append(time.perf_counter() - t0)
        r.raise_for_status()
        http.post(f"/v1/namespaces/{NS}/cancel", json={"case_id": c["case_id"]}).raise_for_status()
    server.should_exit = True
    thread.join(30)
    http.close()

    # The Python API on a fresh hub over the same file (the server closed it).
    hub2 = MemoryHub(db)
    loop2 = asyncio.new_event_loop()
    memory = loop2.run_until_complete(hub2.open(NS, NamespaceConfig()))
    py_times, shown = loop2.run_until_complete(python_recalls(cases[: args.recalls]))
    query_vectors = {c["question"]: hub2.cache.get(c["question"]) for c in cases[: args.recalls]}
    loop2.run_until_complete(hub2.aclose())

    mem0_out = measure_mem0(vectors, query_vectors, args) if not args.no_mem0 else {"skipped": "--no-mem0"}

    out = {
        "benchmark": "bench_api_recall", "items": args.items, "recalls": args.recalls,
        "embedding_cache": "warm (every case recalled once, untimed, before timing)",
        "python_api_recall_ms": summary(py_times), "http_recall_ms": summary(http_times),
        "items_shown_per_recall": round(shown / max(1, len(py_times)), 2),
        "namespace_open_s": round(open_s, 3), "peak_rss_mb": peak_rss_mb(),
        "goal": {"python_api_p50_ms": 5, "http_p50_ms": 10},
        "mem0": mem0_out,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(as_table(out), indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out))


def measure_mem0(vectors: dict, query_vectors: dict, args) -> dict:
    """mem0's search over the same texts and vectors; {"skipped": why} where mem0 is not installed."""
    why = mem0_search.available()
    if why:
        print(f"mem0 left out: {why}", file=sys.stderr)
        return {"skipped": why}
    import mem0

    table = {**{t: np.asarray(v, dtype=np.float32) for t, v in vectors.items()},
             **{q: np.asarray(v, dtype=np.float32) for q, v in query_vectors.items()}}
    memory = mem0_search.open_memory(bench_dir("gr-api-recall-mem0-"), table)
    seed_s = mem0_search.seed(memory, list(vectors))
    queries = list(query_vectors)
    mem0_search.search_times(memory, queries[:20], args.mem0_top_k)  # warm, untimed, as the other two
    times, found = mem0_search.search_times(memory, queries, args.mem0_top_k)
    return {"version": mem0.__version__ if hasattr(mem0, "__version__") else "unknown",
            "search_ms": summary(times), "top_k": args.mem0_top_k, "results_per_search": round(found, 2),
            "seed_s": round(seed_s, 1), "store": "qdrant (local, on disk), infer=False"}


def as_table(r: dict) -> dict:
    """The results file docs/benchmarks.md renders (scripts/bench_docs.py); the raw figures under "raw"."""
    py, http, m0 = r["python_api_recall_ms"], r["http_recall_ms"], r["mem0"]
    rows = [["grandrounds, Python API `recall`", py["p50"], py["p90"], py["p99"], r["goal"]["python_api_p50_ms"]],
            ["grandrounds, HTTP `recall`", http["p50"], http["p90"], http["p99"], r["goal"]["http_p50_ms"]]]
    if "search_ms" in m0:
        s = m0["search_ms"]
        rows.append([f"mem0 {m0['version']} `search` (infer=False, top_k {m0['top_k']})", s["p50"], s["p90"], s["p99"], "-"])
        mem0_about = (f"mem0's search ran in the same run on the same memory texts, vectors and query texts "
                      f"({m0['store']}; {m0['results_per_search']} results a search; seeding {m0['seed_s']} s).")
    else:
        mem0_about = f"mem0's search was not measured in this run: {m0['skipped']}."
    return {
        "title": "recall through the Python API and over HTTP",
        "about": (f"{r['items']} memory items, {r['recalls']} recalls each, {r['embedding_cache']}; the HTTP "
                  "server on 127.0.0.1 in the same run. " + mem0_about),
        "source": "pip install -e '.[bench,mem0]'; python benchmarks/bench_api_recall.py --items 10000 --recalls 200",
        "columns": ["path", "p50 ms", "p90 ms", "p99 ms", "goal p50 ms"],
        "rows": rows,
        "notes": [f"Opening the {r['items']}-item namespace: {r['namespace_open_s']} s (no checkpoint: the log is "
                  f"folded); peak RSS {r['peak_rss_mb']} MB.",
                  "HTTP ran first, the Python API after, on a freshly reopened hub, then mem0: side by side in "
                  "one process, so the ratios hold on this noisy machine where the absolute figures may not.",
                  "Neither side embeds while timed: grandrounds reads its warm embedding cache, mem0's embedder "
                  "answers from the same vectors (benchmarks/mem0_search.py). mem0 without its `nlp`/`extras` "
                  "extras: no spaCy entity boosts or BM25 keyword search, only its vector search and scoring."],
        "raw": r,
    }


if __name__ == "__main__":
    main()
