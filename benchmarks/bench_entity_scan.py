"""The entity scan of de-identification and the review gate on the strings a replay really scans,
builds side by side (alternating).

    python benchmarks/bench_entity_scan.py [--cases 500] [--rounds 3] [--workdir DIR] [--build NAME=PYTHON ...]

Each build's Python replays permutation 0 of bench_replay_rate.py's source run (DIR/source-N.duckdb,
built by it if missing) once in-process, recording every string `entity_candidates` is asked to scan
(the scans the memo does not spare: ~8 a case), then scans those strings again 7 times and reports
the best time per string, and a digest of every result: builds that find the same spans print the
same digest. sim backbone: throughput only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(source: Path, work: Path) -> dict:
    """Runs inside the build under test: imports only `grandrounds` (that build's install)."""
    from grandrounds.handlers import deidentify
    from grandrounds.handlers.policies.selsm import entity_check
    from grandrounds.replay.execute import execute
    from grandrounds.replay.order_replay import plan_replay
    from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
    from grandrounds.store.eventstore import EventStore
    from grandrounds.store.vector_index import single_threaded_blas

    scan = entity_check.entity_candidates
    seen: list[tuple[str, frozenset]] = []

    def recording(text, instance_numbers=frozenset()):
        seen.append((text, frozenset(instance_numbers)))
        return scan(text, instance_numbers)

    entity_check.entity_candidates = deidentify.entity_candidates = recording
    copy = work / f"scan-{time.monotonic_ns()}.duckdb"
    shutil.copyfile(source, copy)
    if Path(f"{source}.keys").exists():
        shutil.copyfile(f"{source}.keys", f"{copy}.keys")
    try:
        with single_threaded_blas(), EventStore(copy) as store:
            cache = EmbeddingCache(shared_minilm(), store.conn)
            job = plan_replay(store, "cab", 1, 0).runs[0].job
            with EventStore(":memory:") as scratch:
                execute(scratch, cache, job.run_id, job.spec, job.cases, checkpoint=False)
    finally:
        entity_check.entity_candidates = deidentify.entity_candidates = scan
        copy.unlink(missing_ok=True)
        Path(f"{copy}.keys").unlink(missing_ok=True)
    results = [scan(t, n) for t, n in seen]
    best = float("inf")
    for _ in range(7):
        c0 = time.process_time()
        for t, n in seen:
            scan(t, n)
        best = min(best, time.process_time() - c0)
    return {"strings": len(seen), "us_per_string": round(best * 1e6 / len(seen), 2),
            "digest": hashlib.sha256(repr(results).encode()).hexdigest()[:16]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/grandrounds-bench")
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON")
    ap.add_argument("--child", metavar="SOURCE", help=argparse.SUPPRESS)
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if a.child:
        print(json.dumps(child(Path(a.child), work)))
        return
    sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
    from bench_replay import build_source
    from benchmarks.common import child_builds, run_children

    source = work / f"source-{a.cases}.duckdb"
    build_source(source, a.cases)
    builds = child_builds(a.build, sys.executable)  # the children run in --workdir: absolute paths
    results = run_children(__file__, builds, a.rounds, ["--child", str(source), "--workdir", str(work)], work)
    digests = {run["digest"] for runs in results.values() for run in runs}
    print(f"entity scan of the strings one {a.cases}-case replay pass scans, us a string (best of 7), per round; "
          f"same spans in every build: {len(digests) == 1}")
    for name, runs in results.items():
        print(f"  {name:<8} {runs[0]['strings']} strings   " + "   ".join(str(run["us_per_string"]) for run in runs))


if __name__ == "__main__":
    main()
