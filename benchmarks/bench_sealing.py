"""The cost of sealing case content (store/sealing.py) per case, side by side in one process.

    python benchmarks/bench_sealing.py [--cases 200] [--json]

The same case stream (the example cases repeated, each copy its own case id and so its own subject:
a new key appended and fsynced per case, the worst case) runs twice through the pipeline (sim
backbone, Evo-MedAgent, warm embedding cache, one commit per case) into two fresh DuckDB files: one
with the default codec (content sealed with AES-GCM-SIV, key file beside it), one without
(`codec=None`, content in clear). Reported: per-case p50/p90/mean for each and the ratio; and the
fingerprints, which must be equal (the fingerprint covers plaintext).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import ms_summary, peak_rss_mb, repeated_cases, time_cases  # noqa: E402

from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.config import EvoMedAgentPolicy  # noqa: E402
from grandrounds.handlers.runs import RunSpec, open_run  # noqa: E402
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base, _ = load_cases(ROOT / "examples" / "cases.jsonl")
    cases = repeated_cases(base, args.cases)
    spec = RunSpec(policy=EvoMedAgentPolicy(), seed=0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sealing-"))
    # Warm the embedding cache once (both runs then read the same vectors from it).
    warm = EventStore(tmp / "warm.duckdb", codec=None)
    wcache = EmbeddingCache(shared_minilm(), warm.conn)
    wctx, _ = open_run(warm, "warm", spec, wcache)
    time_cases(wctx, cases)
    wcache.flush()
    warm.close()

    out = {}
    for name, codec in (("clear", None), ("sealed", "auto")):
        store = EventStore(tmp / f"{name}.duckdb", codec=codec)
        store.conn.execute(f"ATTACH '{tmp / 'warm.duckdb'}' AS w (READ_ONLY)")
        store.conn.execute(EmbeddingCache.SCHEMA)
        store.conn.execute("INSERT INTO embedding_cache SELECT * FROM w.embedding_cache")
        store.conn.execute("DETACH w")
        cache = EmbeddingCache(shared_minilm(), store.conn)
        ctx, _ = open_run(store, "r", spec, cache)
        times, commits = time_cases(ctx, cases)
        out[name] = {"per_case_ms": ms_summary(times), "commit_ms": ms_summary(commits),
                     "fingerprint": store.fingerprint("r"), "sealed": store.codec is not None}
        store.close()
    ratio = out["sealed"]["per_case_ms"]["p50"] / out["clear"]["per_case_ms"]["p50"]
    result = {"cases": len(cases), **out, "p50_ratio_sealed_over_clear": round(ratio, 3),
              "fingerprints_equal": out["sealed"]["fingerprint"] == out["clear"]["fingerprint"],
              "peak_rss_mb": peak_rss_mb()}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{len(cases)} cases, sim backbone, Evo-MedAgent, one commit per case, a new subject per case")
    for name in ("clear", "sealed"):
        s = out[name]["per_case_ms"]
        print(f"  {name:7s} per case p50 {s['p50']:.3f} ms  p90 {s['p90']:.3f} ms  mean {s['mean']:.3f} ms")
    print(f"  sealed / clear p50: {ratio:.3f}x   fingerprints equal: {result['fingerprints_equal']}")


if __name__ == "__main__":
    main()
