"""The cost of sealing case content (store/sealing.py) per case, side by side in one process.

    python benchmarks/bench_sealing.py [--cases 200] [--rounds 2] [--json]

The same case stream (the example cases repeated, each copy its own case id and so its own subject:
a new key appended and fsynced per case, the worst case) runs twice through the pipeline (sim
backbone, Evo-MedAgent, warm embedding cache, one commit per case) into two fresh DuckDB files: one
with the default codec (content sealed with AES-GCM-SIV, key file beside it), one without
(`codec=None`, content in clear), in ABBA order, `--rounds` passes each. Reported: per-case p50/p90/mean
of each variant over its passes, this process's CPU time per case (less sensitive to other processes than
wall time), the ratios, the load average (a loaded machine inflates and scatters the wall times); the
codec's own cost on the same events (seal, open, a new subject's key);
and the fingerprints, which must all be equal (the fingerprint covers plaintext).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import ms_summary, peak_rss_mb, repeated_cases, time_cases  # noqa: E402

from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.config import EvoMedAgentPolicy  # noqa: E402
from grandrounds.handlers.runs import RunSpec, open_run  # noqa: E402
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402
from grandrounds.store.keyring import KeyRing  # noqa: E402
from grandrounds.store.sealing import SealingCodec  # noqa: E402


def _codec_only(clear_db: Path, keys: Path, n_cases: int) -> dict:
    """The codec's own cost on the recorded events of the clear run, without the pipeline around it:
    sealing every event (as `EventStore._build_rows` does), opening the sealed ones (as reads do), and a
    new subject's key (appended to the key file and fsynced), each per case."""
    with EventStore(clear_db, read_only=True, codec=None) as store:
        events = store.read("r")
    codec = SealingCodec(KeyRing(keys))
    refs = [codec.ring.ref(f"bench-subject-{i}") for i in range(50)]
    t0 = time.perf_counter()
    for r in refs:
        codec.ring.ensure([r])
    key_s = (time.perf_counter() - t0) / len(refs)
    for e in events:  # keys for the run's subjects first: the timing below is the cipher work only
        if e.type == "case.received":
            codec.ring.ensure([codec.ring.ref(f"case:{e.case_id}")])
    t0 = time.perf_counter()
    sealed = [(e, codec.seal(e.run_id, e.seq, e.type, e.case_id, e.payload)) for e in events]
    seal_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for e, stored in sealed:
        if stored is not None:
            codec.open(e.run_id, e.seq, e.type, stored)
    open_s = time.perf_counter() - t0
    return {"events": len(events), "sealed_events": sum(1 for _, x in sealed if x is not None),
            "seal_ms_per_case": round(1000 * seal_s / n_cases, 3), "open_ms_per_case": round(1000 * open_s / n_cases, 3),
            "key_ms_per_subject": round(1000 * key_s, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2, help="passes of each variant (even; ABBA order)")
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

    # ABBA order (clear, sealed, sealed, clear, ...): a drift in the machine's load during the run
    # weighs on both sides alike. Each pass is a fresh file (and, sealed, a fresh key file).
    order = [("clear", None), ("sealed", "auto"), ("sealed", "auto"), ("clear", None)] * max(1, args.rounds // 2)
    passes: dict[str, list[dict]] = {"clear": [], "sealed": []}
    for i, (name, codec) in enumerate(order):
        store = EventStore(tmp / f"{name}-{i}.duckdb", codec=codec)
        store.conn.execute(f"ATTACH '{tmp / 'warm.duckdb'}' AS w (READ_ONLY)")
        EmbeddingCache.copy_from(store.conn, "w")
        store.conn.execute("DETACH w")
        cache = EmbeddingCache(shared_minilm(), store.conn)
        ctx, _ = open_run(store, "r", spec, cache)
        cpu0 = time.process_time()
        times, commits = time_cases(ctx, cases)
        cpu = time.process_time() - cpu0  # this process's CPU: far less sensitive to a loaded machine than wall time
        passes[name].append({"times": times, "commits": commits, "cpu_ms_per_case": 1000 * cpu / len(cases),
                             "fingerprint": store.fingerprint("r"),
                             "sealed": store.codec is not None})
        store.close()
    out = {}
    for name, runs in passes.items():
        times = [t for r in runs for t in r["times"]]
        commits = [t for r in runs for t in r["commits"]]
        out[name] = {"per_case_ms": ms_summary(times), "commit_ms": ms_summary(commits),
                     "pass_p50_ms": [ms_summary(r["times"])["p50"] for r in runs],
                     "cpu_ms_per_case": round(sum(r["cpu_ms_per_case"] for r in runs) / len(runs), 3),
                     "fingerprint": runs[0]["fingerprint"], "sealed": runs[0]["sealed"]}
    fingerprints = {r["fingerprint"] for runs in passes.values() for r in runs}
    codec_only = _codec_only(tmp / "clear-0.duckdb", tmp / "codec-only.keys", len(cases))
    ratio = out["sealed"]["per_case_ms"]["p50"] / out["clear"]["per_case_ms"]["p50"]
    mean_ratio = out["sealed"]["per_case_ms"]["mean"] / out["clear"]["per_case_ms"]["mean"]
    cpu_ratio = out["sealed"]["cpu_ms_per_case"] / out["clear"]["cpu_ms_per_case"]
    result = {"cases": len(cases), "passes_each": len(passes["clear"]), **out,
              "p50_ratio_sealed_over_clear": round(ratio, 3), "mean_ratio_sealed_over_clear": round(mean_ratio, 3),
              "cpu_ratio_sealed_over_clear": round(cpu_ratio, 3),
              "sealed_minus_clear_p50_ms": round(out["sealed"]["per_case_ms"]["p50"] - out["clear"]["per_case_ms"]["p50"], 3),
              "fingerprints_equal": len(fingerprints) == 1, "codec_only": codec_only,
              "load_average": list(os.getloadavg()),
              "peak_rss_mb": peak_rss_mb()}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{len(cases)} cases x {len(passes['clear'])} passes each (ABBA), sim backbone, Evo-MedAgent, one commit "
          f"per case, a new subject per case; load average {os.getloadavg()[0]:.1f}")
    for name in ("clear", "sealed"):
        s = out[name]["per_case_ms"]
        print(f"  {name:7s} per case p50 {s['p50']:.3f} ms  p90 {s['p90']:.3f} ms  mean {s['mean']:.3f} ms  "
              f"(pass p50s {out[name]['pass_p50_ms']})  CPU {out[name]['cpu_ms_per_case']:.3f} ms/case")
    print(f"  sealed / clear wall p50: {ratio:.3f}x  mean: {mean_ratio:.3f}x  CPU: {cpu_ratio:.3f}x   "
          f"fingerprints equal: {result['fingerprints_equal']}")
    c = codec_only
    print(f"  the codec alone over the same events: seal {c['seal_ms_per_case']:.3f} ms/case, open "
          f"{c['open_ms_per_case']:.3f} ms/case, new subject key (append + fsync) {c['key_ms_per_subject']:.3f} ms "
          f"({c['events']} events, {c['sealed_events']} sealed)")


if __name__ == "__main__":
    main()
