"""Peak resident memory of `grandrounds run` against the number of cases (sim backbone, warm cache).

    python benchmarks/bench_memory.py [--cases 1000,10000,100000] [--policy evo-medagent]
                                      [--build NAME=PYTHON ...] [--json]

Each size is one `grandrounds run` of the example cases repeated under new ids, in a fresh process
on a fresh --db; its peak RSS (ru_maxrss) is read in that process. A 10-case run gives the base
(interpreter, imports, DuckDB, the model where it loads): "growth" is peak minus base, and the
ratio compares the largest size with the smallest. Builds side by side, alternating per size. The
run's RSS is also read every 0.5 s while it runs: its median is what the run holds most of the time
(the peak can be one transient, e.g. a DuckDB checkpoint).
A build is a Python command, split as a shell would: `--build lim=env GRANDROUNDS_DUCKDB_SET=off
.venv/bin/python` runs this build without the store's DuckDB memory settings (store/dbsettings.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
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


SAMPLE_S = 0.5
"""How often the run's resident memory is read while it runs (/proc/PID/status, VmRSS)."""


def _vm_rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_mb(python: str, cases: Path, db: Path, policy: str, samples: list[int] | None = None) -> tuple[float, float]:
    """(peak MB, seconds); `samples` gets the run's RSS in KB every SAMPLE_S while it runs (what it holds
    most of the time, against the peak: a transient such as a DuckDB checkpoint sets the peak alone)."""
    t0 = time.perf_counter()
    cmd = [*shlex.split(python), "-c", WRAP, "run", str(cases), "--db", str(db), "--policy", policy, "--json"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=db.parent) as proc:
        # the output is read by threads so that a full pipe never blocks the run while it is sampled
        import threading

        got: dict[str, str] = {}
        readers = [threading.Thread(target=lambda k=k, f=f: got.__setitem__(k, f.read()))
                   for k, f in (("out", proc.stdout), ("err", proc.stderr))]
        for r in readers:
            r.start()
        while proc.poll() is None:
            kb = _vm_rss_kb(proc.pid)
            if samples is not None and kb:
                samples.append(kb)
            time.sleep(SAMPLE_S)
        for r in readers:
            r.join()
    if proc.returncode != 0:
        raise RuntimeError(got["err"][-1500:])
    kb = int(got["err"].rsplit("MAXRSS_KB", 1)[1].split()[0])
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
    held: dict[str, dict[int, float | None]] = {n: {} for n in builds}
    for i, size in enumerate([10, *sizes]):
        order = list(builds.items())
        for name, python in (order if i % 2 == 0 else order[::-1]):
            samples: list[int] = []
            results[name][size] = peak_mb(python, case_file(work, size), work / f"{name}-{size}.duckdb", a.policy,
                                          samples)
            held[name][size] = round(statistics.median(samples) / 1024, 1) if samples else None
            print(f"{name} {size} cases: peak {results[name][size][0]:.1f} MB, median while running "
                  f"{held[name][size]} MB, {results[name][size][1]:.1f} s",
                  file=sys.stderr, flush=True)  # as each run ends: a long sweep's figures survive an interruption
    for name, by in results.items():
        base = by[10][0]
        out["builds"][name] = {
            "base_mb_10_cases": round(base, 1),
            "peak_mb": {n: round(by[n][0], 1) for n in sizes},
            "growth_mb": {n: round(by[n][0] - base, 1) for n in sizes},
            "median_rss_while_running_mb": {n: held[name][n] for n in sizes},
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
              f"; ratio {v['peak_ratio_largest_smallest']}, {v['kb_per_case_beyond_smallest']} KB/case; median while "
              "running " + ", ".join(f"{n}: {mb} MB" for n, mb in v["median_rss_while_running_mb"].items()))


if __name__ == "__main__":
    main()
