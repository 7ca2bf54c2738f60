"""Peak resident memory of `grandrounds run` against the number of cases (sim backbone, warm cache).

    python benchmarks/bench_memory.py [--cases 1000,10000,100000] [--policy evo-medagent]
                                      [--build NAME=PYTHON ...] [--json]

Each size is one `grandrounds run` of the example cases repeated under new ids, in a fresh process
on a fresh --db; its peak RSS (ru_maxrss) is read in that process. A 10-case run gives the base
(interpreter, imports, DuckDB, the model where it loads): "growth" is peak minus base, and the
ratio compares the largest size with the smallest. Builds side by side, alternating per size.
A build is a Python command, split as a shell would: `--build lim=env GRANDROUNDS_DUCKDB_SET=off
.venv/bin/python` runs this build without the store's DuckDB memory settings (store/dbsettings.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_dir  # noqa: E402

WRAP = """
import resource, sys
from grandrounds.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    if exc.code:
        raise
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def case_file(folder: Path, n: int) -> Path:
    path = folder / f"cases-{n}.jsonl"
    if not path.exists():
        lines = (ROOT / "examples" / "cases.jsonl").read_text(encoding="utf-8").splitlines()
        with path.open("w", encoding="utf-8") as f:
            for i in range(n):
                c = json.loads(lines[i % len(lines)])
                c["case_id"] = f"{c['case_id']}-{i // len(lines)}"
                f.write(json.dumps(c) + "\n")
    return path


def peak_mb(python: str, cases: Path, db: Path, policy: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    out = subprocess.run([*shlex.split(python), "-c", WRAP, "run", str(cases), "--db", str(db), "--policy", policy, "--json"],
                         capture_output=True, text=True, cwd=db.parent)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-1500:])
    kb = int(out.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0])
    for leftover in (db, db.with_name(db.name + ".wal"), db.with_name(db.name + ".keys")):
        leftover.unlink(missing_ok=True)
    return kb / 1024, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1000,10000,100000")
    ap.add_argument("--policy", default="evo-medagent")
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    builds = dict(b.split("=", 1) for b in a.build) or {"this": sys.executable}
    sizes = [int(x) for x in a.cases.split(",")]
    work = bench_dir("gr-bench-memory-")
    out: dict = {"policy": a.policy, "builds": {}}
    for name, python in builds.items():  # warm the embedding caches with the texts of these cases
        peak_mb(python, case_file(work, 200), work / "warm.duckdb", a.policy)
    results = {n: {} for n in builds}
    for i, size in enumerate([10, *sizes]):
        order = list(builds.items())
        for name, python in (order if i % 2 == 0 else order[::-1]):
            results[name][size] = peak_mb(python, case_file(work, size), work / f"{name}-{size}.duckdb", a.policy)
            print(f"{name} {size} cases: peak {results[name][size][0]:.1f} MB, {results[name][size][1]:.1f} s",
                  file=sys.stderr, flush=True)  # as each run ends: a long sweep's figures survive an interruption
    for name, by in results.items():
        base = by[10][0]
        out["builds"][name] = {
            "base_mb_10_cases": round(base, 1),
            "peak_mb": {n: round(by[n][0], 1) for n in sizes},
            "growth_mb": {n: round(by[n][0] - base, 1) for n in sizes},
            "seconds": {n: round(by[n][1], 1) for n in sizes},
            "peak_ratio_largest_smallest": round(by[sizes[-1]][0] / by[sizes[0]][0], 2),
            "kb_per_case_beyond_smallest": round((by[sizes[-1]][0] - by[sizes[0]][0]) * 1024
                                                 / max(1, sizes[-1] - sizes[0]), 1)}
    out["loadavg_1min"] = round(os.getloadavg()[0], 1)
    if a.json:
        print(json.dumps(out))
        return
    print(f"peak RSS of `grandrounds run` ({a.policy}, sim, warm cache), load average {out['loadavg_1min']}")
    for name, v in out["builds"].items():
        print(f"  {name:<8} base {v['base_mb_10_cases']} MB; peak " +
              ", ".join(f"{n}: {mb} MB" for n, mb in v["peak_mb"].items()) +
              f"; ratio {v['peak_ratio_largest_smallest']}, {v['kb_per_case_beyond_smallest']} KB/case")


if __name__ == "__main__":
    main()
