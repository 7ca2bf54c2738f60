"""Write the golden logs: short runs of each policy (sim backbone) exported to tests/golden/*.jsonl.

    python scripts/golden_logs.py          # (re)write every golden log
    python scripts/golden_logs.py none     # only these (meta holds wall-clock times: rewriting a log
                                           # changes its file even when its events are the same)

tests/test_golden_logs.py imports each log into a fresh store and re-executes it with this build: the
fingerprint must be identical. A change that alters event bytes fails that test; regenerating the logs
with this script is then the deliberate, reviewed step (say so in the commit message).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
CASES = ROOT / "examples" / "cases.jsonl"
N_CASES = 6

# name -> extra `grandrounds run` arguments
RUNS = {
    "evo-medagent": ["--policy", "evo-medagent"],
    "evo-medagent-tools": ["--policy", "evo-medagent", "--sim-tool", "ddx-lookup=0.95", "--sim-tool", "triage-score=0.1"],
    "skemex": ["--policy", "skemex"],
    "selsm": ["--policy", "selsm"],
    "retrosum": ["--policy", "retrosum"],
    "precedent": ["--policy", "precedent"],
    "none": ["--policy", "none"],
}


def _grandrounds(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "grandrounds", *args, "--json"], check=True, capture_output=True,
                         text=True, cwd=ROOT, env=dict(os.environ, PYTHONHASHSEED="0"))
    return json.loads(out.stdout)


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        print(f"unknown golden runs {unknown} (known: {', '.join(RUNS)})", file=sys.stderr)
        return 2
    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cases = Path(tmp) / "cases.jsonl"
        cases.write_text("".join(CASES.read_text(encoding="utf-8").splitlines(keepends=True)[:N_CASES]))
        db = str(Path(tmp) / "golden.duckdb")
        for name, extra in RUNS.items():
            if names and name not in names:
                continue
            run_id = f"golden-{name}"
            summary = _grandrounds("run", str(cases), "--db", db, "--run-id", run_id, "--backbone", "sim", *extra)
            target = GOLDEN / f"{name}.jsonl"
            part = target.with_suffix(".jsonl.tmp")
            _grandrounds("export", "--db", db, run_id, "--out", str(part), "--format", "jsonl")
            part.replace(target)  # atomic: a golden log is never half written
            print(f"{name:20s} {summary['events']:4d} events  {summary['fingerprint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
