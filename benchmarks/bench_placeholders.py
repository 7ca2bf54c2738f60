"""The placeholders each policy writes on the official MedAgentBench tasks the local sandbox grades.

    python benchmarks/bench_placeholders.py [--json benchmarks/results/placeholders.json]

Runs `grandrounds run test_data_v2.json --env medagentbench --funcs funcs_v1.json --patients
patients_from_snapshot.json --policy P --json` for each memory policy (sim backbone: the trajectories are
scripted for the task templates, not a model's; its accuracy is not a clinical measure) and records the
`deidentified` counts the run reports: the placeholders written into memory, by kind. Needs the shared
data (`../shared/data/medagentbench`, `../shared/data/medagentbench_rl_fork`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT / "benchmarks"))
import provenance  # noqa: E402

TASKS = DATA / "medagentbench" / "test_data_v2.json"
FUNCS = DATA / "medagentbench" / "funcs_v1.json"
PATIENTS = DATA / "medagentbench_rl_fork" / "patients_from_snapshot.json"
POLICIES = ("evo-medagent", "skemex", "selsm", "retrosum")


def run(policy: str, folder: Path) -> dict:
    cmd = [sys.executable, "-m", "grandrounds", "run", str(TASKS), "--env", "medagentbench", "--funcs", str(FUNCS),
           "--patients", str(PATIENTS), "--policy", policy, "--db", str(folder / f"{policy}.duckdb"), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=folder,
                         env={**os.environ, "OPENAI_BASE_URL": ""})
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{policy}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def as_table(results: dict[str, dict]) -> dict:
    kinds = sorted({k for r in results.values() for k in r.get("deidentified", {})})
    rows = [[p, *[str(r.get("deidentified", {}).get(k, 0)) for k in kinds], f"{r['correct']}/{r['cases']}"]
            for p, r in results.items()]
    return {
        "title": "Placeholders written into memory on the official MedAgentBench tasks, per policy",
        "about": ("The 120 tasks of types 1, 2, 3 and 8 the local sandbox grades, sim backbone (scripted "
                  "trajectories, not a model's: its accuracy is not a clinical measure); the `deidentified` "
                  "counts `grandrounds run --json` reports, by placeholder, under each policy's defaults. The "
                  "names, addresses and phones come from the Patient resources the agent fetched, copied into "
                  "the trajectory an episode, a SkeMex trajectory or a SELSM record keeps."),
        "source": "python benchmarks/bench_placeholders.py --json benchmarks/results/placeholders.json",
        "columns": ["policy", *kinds, "sim correct"],
        "rows": rows,
        "notes": [],
        "raw": {p: {"deidentified": r.get("deidentified", {}), "fingerprint": r.get("fingerprint")}
                for p, r in results.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the results file here")
    args = ap.parse_args()
    at = provenance.measured()
    for path in (TASKS, FUNCS, PATIENTS):
        if not path.exists():
            raise SystemExit(f"shared data absent: {path}")
    with tempfile.TemporaryDirectory() as tmp:
        results = {p: run(p, Path(tmp)) for p in POLICIES}
    doc = as_table(results)
    print(json.dumps(doc["rows"]))
    if args.json:
        provenance.write_results(args.json, {**doc, "measured": at})


if __name__ == "__main__":
    main()
