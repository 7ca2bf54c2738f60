"""Replay on worker processes against one process, as a user runs it (`grandrounds replay`), at a few
hundred cases: does a second worker pay for itself? Builds side by side, alternating.

    python benchmarks/bench_workers.py [--cases 400] [--rounds 2] [--build NAME=PYTHON ...] [--json]

The source run holds --cases/2 example cases (repeated under new ids); `replay --permutations 2`
replays it twice, so each replay executes --cases cases, with --workers 1 and --workers 2, each on a
fresh copy of the source file (a warm embedding cache: the source run's vectors are in it). Wall time
of the whole command (interpreter start included). sim backbone: throughput only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_dir  # noqa: E402


def cli(python: str, args: list[str], cwd: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = subprocess.run([python, "-m", "grandrounds", *args, "--json"], capture_output=True, text=True, cwd=cwd)
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{python} {' '.join(args)}: {out.stderr[-1500:]}")
    return dt, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    builds = dict(b.split("=", 1) for b in a.build) or {"this": sys.executable}
    work = bench_dir("gr-bench-workers-")
    lines = (ROOT / "examples" / "cases.jsonl").read_text(encoding="utf-8").splitlines()
    half = a.cases // 2
    cases = []
    for i in range(half):
        c = json.loads(lines[i % len(lines)])
        c["case_id"] = f"{c['case_id']}-{i // len(lines)}"
        cases.append(json.dumps(c))
    (work / "cases.jsonl").write_text("\n".join(cases) + "\n", encoding="utf-8")
    sources = {}
    for name, python in builds.items():
        sources[name] = work / f"source-{name}.duckdb"
        cli(python, ["run", str(work / "cases.jsonl"), "--db", str(sources[name]), "--run-id", "src"], work)
    rates: dict = {n: {1: [], 2: []} for n in builds}
    for r in range(a.rounds):
        order = list(builds.items())
        for name, python in (order if r % 2 == 0 else order[::-1]):
            for w in ((1, 2) if r % 2 == 0 else (2, 1)):
                db = work / f"copy-{name}.duckdb"
                shutil.copyfile(sources[name], db)
                if Path(f"{sources[name]}.keys").exists():  # sealed case content needs its key file
                    shutil.copyfile(f"{sources[name]}.keys", f"{db}.keys")
                dt, out = cli(python, ["replay", "--db", str(db), "--from", "src", "--permutations", "2",
                                       "--workers", str(w)], work)
                assert out["cases_executed"] == 2 * half
                rates[name][w].append(2 * half / dt)
                db.unlink()
                Path(f"{db}.keys").unlink(missing_ok=True)
    out = {"cases": 2 * half, "loadavg_1min": round(os.getloadavg()[0], 1), "cases_per_s": {
        n: {f"{w} worker{'s' if w > 1 else ''}": [round(min(v), 1), round(max(v), 1)] for w, v in by.items()}
        for n, by in rates.items()},
        "two_over_one_per_round": {n: [round(b / o, 2) for o, b in zip(by[1], by[2])] for n, by in rates.items()}}
    if a.json:
        print(json.dumps(out))
        return
    print(f"replay --permutations 2 of a {half}-case run ({2 * half} cases), wall time incl. interpreter start, "
          f"cases/s min-max, load average {out['loadavg_1min']} on {os.cpu_count()} CPUs")
    for n in builds:
        v = out["cases_per_s"][n]
        print(f"  {n:<8} 1 worker {v['1 worker']}  2 workers {v['2 workers']}  "
              f"2/1 per round {out['two_over_one_per_round'][n]}")


if __name__ == "__main__":
    main()
