"""Time to first case on a new --db: `grandrounds run` of one case into a file that does not exist yet,
wall time of the whole command (interpreter start, imports, the run, the summary), side by side for
one or more builds, alternating.

    python benchmarks/bench_first_case.py [--rounds 3] [--build NAME=PYTHON ...] [--json]

Each build is a Python interpreter with grandrounds installed (default: this one). The machine
embedding cache is warmed first with one run of the same case (per build), so what is timed is a
new file on a machine that has seen the case's texts: with the machine cache the model never
loads; a build without one embeds every text again in every new file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_dir  # noqa: E402


def one_run(python: str, case_file: Path, db: Path) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([python, "-m", "grandrounds", "run", str(case_file), "--db", str(db), "--json"],
                         capture_output=True, text=True, cwd=db.parent)  # not a source tree: the build's install
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{python}: {out.stderr[-1500:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    builds = dict(b.split("=", 1) for b in a.build) or {"this": sys.executable}
    work = bench_dir("gr-bench-first-")
    case_file = work / "one.jsonl"
    case_file.write_text((ROOT / "examples" / "cases.jsonl").read_text(encoding="utf-8").splitlines()[0] + "\n",
                         encoding="utf-8")
    for name, python in builds.items():  # warm the machine cache (a build without one: nothing to warm)
        one_run(python, case_file, work / f"warm-{name}.duckdb")
    times: dict[str, list[float]] = {n: [] for n in builds}
    for r in range(a.rounds):
        order = list(builds.items())
        for name, python in (order if r % 2 == 0 else order[::-1]):
            times[name].append(one_run(python, case_file, work / f"{name}-{r}.duckdb"))
    out: dict = {n: {"seconds_min": round(min(t), 2), "seconds_median": round(statistics.median(t), 2),
               "seconds_max": round(max(t), 2)} for n, t in times.items()}
    out["loadavg_1min"] = round(os.getloadavg()[0], 1)
    if a.json:
        print(json.dumps(out))
        return
    print(f"time to first case on a new --db (one case, warm machine cache), {a.rounds} rounds   [target <= 3 s]")
    for n, v in out.items():
        if n == "loadavg_1min":
            print(f"  load average {v} on {os.cpu_count()} CPUs")
            continue
        print(f"  {n:<10} {v['seconds_min']:6.2f} - {v['seconds_max']:6.2f} s (median {v['seconds_median']})")


if __name__ == "__main__":
    main()
