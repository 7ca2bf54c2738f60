"""The cost of sealing case content (store/sealing.py) per case, side by side in one process.

    python benchmarks/bench_sealing.py [--cases 200] [--rounds 2] [--json] [--results PATH]

The same case stream (the example cases repeated, each copy its own case id and so its own subject:
a new key appended and fsynced per case, the worst case) runs twice through the pipeline (sim
backbone, Evo-MedAgent, warm embedding cache, one commit per case) into two fresh DuckDB files: one
with the default codec (content sealed with AES-GCM-SIV, key file beside it), one without
(`codec=None`, content in clear), in ABBA order, `--rounds` passes each. Reported: per-case p50/p90/mean
of each variant over its passes, this process's CPU time per case (less sensitive to other processes than
wall time), the ratios, the load average (a loaded machine inflates and scatters the wall times); the
codec's own cost on the same events (seal, open, a new subject's key);
and the fingerprints, which must all be equal (the fingerprint covers plaintext).
--results PATH writes the results document benchmarks/results/sealing.json is: a row per round (the
i-th clear pass beside the i-th sealed pass) and one over all passes, the codec-alone figures and the
load average before and after in its notes, the command line, where it was measured and the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import provenance  # noqa: E402  (benchmarks/provenance.py)
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
    ap.add_argument("--results", default=None, metavar="PATH",
                    help="also write the results document (benchmarks/results/sealing.json)")
    args = ap.parse_args()
    command = "python " + shlex.join(sys.argv)
    where = provenance.measured()  # at the start: the code this run measures
    load_before = os.getloadavg()
    wall0 = time.perf_counter()
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
    if args.results:
        write_results(args.results, command, where, result, passes, load_before, time.perf_counter() - wall0)
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


def _row(label: str, clear: list[dict], sealed: list[dict]) -> tuple[list[str], dict]:
    c = ms_summary([t for r in clear for t in r["times"]])
    s = ms_summary([t for r in sealed for t in r["times"]])
    c_cpu = sum(r["cpu_ms_per_case"] for r in clear) / len(clear)
    s_cpu = sum(r["cpu_ms_per_case"] for r in sealed) / len(sealed)
    raw = {"round": label, "clear_ms": c, "sealed_ms": s, "p50_ratio": round(s["p50"] / c["p50"], 3),
           "clear_cpu_ms_per_case": round(c_cpu, 3), "sealed_cpu_ms_per_case": round(s_cpu, 3),
           "cpu_ratio": round(s_cpu / c_cpu, 3)}
    return ([label, f"{c['p50']:.1f} / {c['mean']:.1f} ms", f"{s['p50']:.1f} / {s['mean']:.1f} ms",
             f"{raw['p50_ratio']:.2f}x", f"{c_cpu:.2f} → {s_cpu:.2f} ms", f"**{raw['cpu_ratio']:.2f}x**"], raw)


def write_results(path: str, command: str, where: dict, result: dict, passes: dict[str, list[dict]],
                  load_before: tuple[float, ...], wall_s: float) -> None:
    """The results document: a row per round (the i-th clear pass beside the i-th sealed pass), then one
    over all passes; the codec-alone figures and the load in the notes; `result` (the --json output) raw."""
    n = len(passes["clear"])
    rows, raw_rows = [], []
    for i in range(n):
        row, raw = _row(str(i + 1), [passes["clear"][i]], [passes["sealed"][i]])
        rows.append(row)
        raw_rows.append(raw)
    row, raw = _row(f"all ({n} each)", passes["clear"], passes["sealed"])
    rows.append(row)
    raw_rows.append(raw)
    c = result["codec_only"]
    load_after = os.getloadavg()
    cpus = os.cpu_count()
    fmt = ", ".join
    diff = result["sealed_minus_clear_p50_ms"]
    provenance.write_results(path, {
        "title": "What sealing case content costs",
        "about": (f"The same {result['cases']}-case stream (sim backbone, evo-medagent, warm embedding cache, one "
                  "commit per case, every case its own subject so every case appends and fsyncs a new key: the "
                  f"worst case) in clear and sealed, {n} passes each in ABBA order in one process, each pass a "
                  "fresh DuckDB file. A row per round sets the i-th clear pass beside the i-th sealed pass; the "
                  "last row is over all passes. The process's CPU time is the steadier figure on a shared machine. "
                  + ("The passes' fingerprints are all equal." if result["fingerprints_equal"]
                     else "**The passes' fingerprints differ.**")),
        "source": command,
        "columns": ["round", "clear wall p50 / mean", "sealed wall p50 / mean", "sealed / clear wall p50",
                    "CPU per case clear → sealed", "sealed / clear CPU"],
        "rows": rows,
        "notes": [
            f"The codec alone on the same events ({c['events']} events, {c['sealed_events']} of them sealed): "
            f"sealing {c['seal_ms_per_case']:.2f} ms and opening {c['open_ms_per_case']:.2f} ms per case; a new "
            f"subject's key {c['key_ms_per_subject']:.2f} ms (appended to the key file and fsynced). Over all "
            f"passes the sealed wall p50 is {diff:+.2f} ms per case against clear; of that difference the script "
            "measures only the codec's share above, not the rest (the key's fsync inside a case, DuckDB writing "
            "the larger sealed rows).",
            f"Load average (1, 5, 15 min) on {cpus} cores: {fmt(f'{x:.2f}' for x in load_before)} before the run, "
            f"{fmt(f'{x:.2f}' for x in load_after)} after it; the run took {wall_s / 60:.1f} min; peak RSS "
            f"{result['peak_rss_mb']} MB.",
        ],
        "measured": where,
        "raw": {**result, "rounds": raw_rows, "wall_s": round(wall_s, 1), "cpus": cpus,
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in load_after]},
    })


if __name__ == "__main__":
    main()
