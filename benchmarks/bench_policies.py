"""Per-policy memory overhead per case, side by side in one run (DESIGN §9, issue 6).

    python benchmarks/bench_policies.py [--items 10000] [--cases 200] [--json] [--results PATH]

Runs each policy's benchmark one after the other on the same machine, each with a memory of
--items synthetic items (rules+episodes, skills, SELSM records, experiences) and the example
cases on top, sim backbone, warm embedding cache; prints the p50/p90 of everything but model
calls per case (the case's DuckDB commit included). Separate processes, so one policy's
memory and caches cannot flatter another's. The machine is noisy: compare within one run.
--results PATH writes the results document benchmarks/results/policies_overhead.json is (the table
the docs page renders, the command line, where it was measured, the load average before and after,
and every script's raw output).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import provenance  # noqa: E402  (a sibling module, not a package)

ORDER = ("evo-medagent", "skemex", "selsm", "retrosum", "none")
ROW_NOTES = {"selsm": "K = 3 trajectories judged per case included (the policy's default train_samples)",
             "none": "the floor every policy pays: stages, event encoding, the commit (run in bench_policy_selsm.py)"}


def _bench(script: str, args: list[str]) -> dict:
    out = subprocess.run([sys.executable, str(HERE / script), *args, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--results", default=None, metavar="PATH",
                    help="also write the results document (benchmarks/results/policies_overhead.json)")
    a = ap.parse_args()
    command = "python " + shlex.join(sys.argv)
    where = provenance.measured()  # at the start: the code this run measures
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    n, c = str(a.items), str(a.cases)
    rows: dict[str, dict] = {}
    core = _bench("bench_core.py", ["--items", n, "--cases", c])
    rows["evo-medagent"] = core["per_case_ms"]["commit per case"]
    selsm = _bench("bench_policy_selsm.py", ["--records", n, "--cases", c])
    rows["none"] = selsm["per_case_ms"]["none"]
    rows["selsm"] = selsm["per_case_ms"]["paper"]
    skemex = _bench("bench_policy_skemex.py", ["--skills", n, "--cases", c])
    rows["skemex"] = skemex["per_case_ms"]
    retrosum = _bench("bench_policy_retrosum.py", ["--experiences", n, "--cases", c])
    rows["retrosum"] = retrosum["per_case_ms"]
    table = {k: {"p50": v["p50"], "p90": v["p90"]} for k, v in rows.items()}
    if a.results:
        wall = time.perf_counter() - t0
        load_after = os.getloadavg()
        raw = {"items": a.items, "cases": a.cases, "wall_s": round(wall, 1),
               "load_average_before": [round(x, 2) for x in load_before],
               "load_average_after": [round(x, 2) for x in load_after], "cpus": os.cpu_count(),
               "per_case_ms": {k: rows[k] for k in ORDER},
               "scripts": {"bench_core.py": core, "bench_policy_selsm.py": selsm,
                           "bench_policy_skemex.py": skemex, "bench_policy_retrosum.py": retrosum}}
        provenance.write_results(a.results, {
            "title": "Memory overhead per case, every policy side by side",
            "about": (f"{a.items:,} memory items, {a.cases} cases, sim backbone, warm embedding cache, one "
                      "`bench_policies.py` run (each policy's script in its own process, one after the other); "
                      "p50 / p90 in ms of everything but model calls, the case's DuckDB commit included."),
            "source": command,
            "columns": ["policy", "p50 / p90 ms", "note"],
            "rows": [[k, f"{rows[k]['p50']:.1f} / {rows[k]['p90']:.1f}", ROW_NOTES.get(k, "")] for k in ORDER],
            "notes": [f"Load average (1, 5, 15 min) on {os.cpu_count()} cores: "
                      f"{', '.join(f'{x:.2f}' for x in load_before)} before the run, "
                      f"{', '.join(f'{x:.2f}' for x in load_after)} after it; the run took {wall / 60:.1f} min. "
                      "Wall times on a shared machine scatter: compare the rows within one run."],
            "measured": where,
            "raw": raw})
    if a.json:
        print(json.dumps({"items": a.items, "cases": a.cases, "per_case_ms": table}))
        return
    print(f"memory overhead per case, {a.items} items, sim backbone, warm cache (target p50 ≤ 10 ms)")
    for k, v in table.items():
        print(f"  {k:<14} p50 {v['p50']:7.2f} ms   p90 {v['p90']:7.2f} ms")


if __name__ == "__main__":
    main()
