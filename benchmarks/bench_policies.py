"""Per-policy memory overhead per case, side by side in one run (DESIGN §9, issue 6).

    python benchmarks/bench_policies.py [--items 10000] [--cases 200] [--json]

Runs each policy's benchmark one after the other on the same machine, each with a memory of
--items synthetic items (rules+episodes, skills, SELSM records, experiences) and the example
cases on top, sim backbone, warm embedding cache; prints the p50/p90 of everything but model
calls per case (the case's DuckDB commit included). Separate processes, so one policy's
memory and caches cannot flatter another's. The machine is noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _bench(script: str, args: list[str]) -> dict:
    out = subprocess.run([sys.executable, str(HERE / script), *args, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    n, c = str(a.items), str(a.cases)
    rows: dict[str, dict] = {}
    core = _bench("bench_core.py", ["--items", n, "--cases", c])
    rows["evo-medagent"] = core["per_case_ms"]["commit per case"]
    selsm = _bench("bench_policy_selsm.py", ["--records", n, "--cases", c])
    rows["none"] = selsm["per_case_ms"]["none"]
    rows["selsm"] = selsm["per_case_ms"]["paper"]
    rows["skemex"] = _bench("bench_policy_skemex.py", ["--skills", n, "--cases", c])["per_case_ms"]
    rows["retrosum"] = _bench("bench_policy_retrosum.py", ["--experiences", n, "--cases", c])["per_case_ms"]
    table = {k: {"p50": v["p50"], "p90": v["p90"]} for k, v in rows.items()}
    if a.json:
        print(json.dumps({"items": a.items, "cases": a.cases, "per_case_ms": table}))
        return
    print(f"memory overhead per case, {a.items} items, sim backbone, warm cache (target p50 ≤ 10 ms)")
    for k, v in table.items():
        print(f"  {k:<14} p50 {v['p50']:7.2f} ms   p90 {v['p90']:7.2f} ms")


if __name__ == "__main__":
    main()
