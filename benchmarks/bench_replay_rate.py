"""Replay throughput of one process: one permutation of a recorded sim run executed in-process,
repeated, builds side by side (alternating). The per-case cost of a replay without the CLI around it.

    python benchmarks/bench_replay_rate.py [--cases 500] [--reps 3] [--rounds 2] [--workdir DIR]
                                          [--build NAME=PYTHON ...] [--json]

The source run (--cases ChestAgentBench cases, evo-medagent, sim) is built once in
DIR/source-N.duckdb by bench_replay.py's `build_source` (first build embeds every text: minutes) and
reused. Each build's Python then replays permutation 0 of it --reps times into an in-memory store
(warm embedding cache: the source file's vectors and the machine cache), printing cases/s by wall
time and by this process's CPU time (on a shared core the CPU rate is the steadier figure), and the
share of that CPU time the garbage collector took (its callbacks' CPU time). The first
repetition pays the process's first-use costs (vectors read from the file, imports); the later ones
are the steady rate. The fingerprint of every repetition is printed: builds must agree.
sim backbone: throughput only, not a clinical measure.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(source: Path, work: Path, reps: int) -> list[dict]:
    """Runs inside the build under test: imports only `grandrounds` (that build's install)."""
    from grandrounds.replay.execute import execute
    from grandrounds.replay.order_replay import plan_replay
    from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
    from grandrounds.store.eventstore import EventStore
    from grandrounds.store.vector_index import single_threaded_blas

    copy = work / f"rate-{time.monotonic_ns()}.duckdb"
    shutil.copyfile(source, copy)
    if Path(f"{source}.keys").exists():  # sealed case content needs its key file
        shutil.copyfile(f"{source}.keys", f"{copy}.keys")
    out = []
    collecting: list[float] = []  # CPU time of the garbage collector's passes, from its callbacks
    began = [0.0]

    def on_gc(phase: str, _info: dict) -> None:
        if phase == "start":
            began[0] = time.process_time()
        else:
            collecting.append(time.process_time() - began[0])

    gc.callbacks.append(on_gc)
    try:
        with single_threaded_blas(), EventStore(copy) as store:
            cache = EmbeddingCache(shared_minilm(), store.conn)
            job = plan_replay(store, "cab", 1, 0).runs[0].job
            for _ in range(reps):
                try:  # each repetition starts without the de-identification memo of the one before
                    from grandrounds.handlers import deidentify
                    deidentify._SPANS.clear()
                except AttributeError:
                    pass
                with EventStore(":memory:") as scratch:
                    collecting.clear()
                    t0, c0 = time.perf_counter(), time.process_time()
                    execute(scratch, cache, job.run_id, job.spec, job.cases, checkpoint=False)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    gc_cpu = sum(collecting)
                    fp = scratch.fingerprint(job.run_id)
                n = len(job.cases)
                out.append({"wall_cases_per_s": round(n / wall, 1), "cpu_cases_per_s": round(n / cpu, 1),
                            "gc_share_pct": round(100 * gc_cpu / cpu, 1), "fingerprint": fp[:16]})
    finally:
        gc.callbacks.remove(on_gc)
        copy.unlink(missing_ok=True)
        Path(f"{copy}.keys").unlink(missing_ok=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/grandrounds-bench")
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", metavar="SOURCE", help=argparse.SUPPRESS)
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if a.child:
        print(json.dumps(child(Path(a.child), work, a.reps)))
        return
    sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
    from bench_replay import build_source
    from benchmarks.common import child_builds, run_children

    source = work / f"source-{a.cases}.duckdb"
    build_source(source, a.cases)
    builds = child_builds(a.build, sys.executable)  # the children run in --workdir: absolute paths
    results = run_children(__file__, builds, a.rounds,
                           ["--child", str(source), "--reps", str(a.reps), "--workdir", str(work)], work)
    fps = {rep["fingerprint"] for runs in results.values() for run in runs for rep in run}
    report = {"cases": a.cases, "reps": a.reps, "rounds": a.rounds, "fingerprints_agree": len(fps) == 1,
              "results": results}
    if a.json:
        print(json.dumps(report))
        return
    print(f"one permutation of {a.cases} ChestAgentBench cases replayed in-process (sim), cases/s, "
          f"first repetition / later ones, per round; fingerprints agree: {len(fps) == 1}")
    for name, runs in results.items():
        for kind, key in (("cpu", "cpu_cases_per_s"), ("wall", "wall_cases_per_s"), ("gc %", "gc_share_pct")):
            cells = "   ".join(f"{run[0][key]} / " + ", ".join(str(x[key]) for x in run[1:]) for run in runs)
            print(f"  {name:<8} {kind:<4} {cells}")


if __name__ == "__main__":
    main()
