"""Write the golden logs: short runs exported to tests/golden/*.jsonl.

    python scripts/golden_logs.py          # (re)write every golden log
    python scripts/golden_logs.py none     # only these (a sim run's log is rewritten byte for byte;
                                           # a model run's meta holds request latencies, so rewriting
                                           # it changes its file, not its fingerprint)

The runs: each policy on the first MCQ cases (sim backbone), one with simulated tools, one recorded-model
run (`model-evo-medagent`: --backbone openai against tests/fake_openai_server.py, started here in-process;
its exchanges are recorded in the log, so re-executing it needs no server), and one per environment (sim
backbone): `env-medagentbench` (FHIR tasks against the local sandbox) and `env-agentclinic` (OSCE cases).
The environment runs read the shared benchmark data (../shared/data, never copied here): their logs hold
what a run records (the cases, the files' paths and sha256), and re-executing them needs those files.

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
N_MODEL_CASES = 4
DATA = ROOT.parent / "shared" / "data"  # the shared benchmark data, as the tests reach it
MAB_TASKS = DATA / "medagentbench" / "test_data_v2.json"
MAB_FUNCS = DATA / "medagentbench" / "funcs_v1.json"
MAB_PATIENTS = DATA / "medagentbench_rl_fork" / "patients_from_snapshot.json"
AC_MEDQA = DATA / "agentclinic" / "agentclinic_medqa.jsonl"
MAB_TASK_IDS = ("task1_1", "task3_1", "task8_1")
"""A GET lookup graded on the answer, and two POSTs graded on their payload: gradable offline."""
MODEL = "golden-fake"

# name -> extra `grandrounds run` arguments
RUNS = {
    "evo-medagent": ["--policy", "evo-medagent"],
    "evo-medagent-tools": ["--policy", "evo-medagent", "--sim-tool", "ddx-lookup=0.95", "--sim-tool", "triage-score=0.1"],
    "skemex": ["--policy", "skemex"],
    "selsm": ["--policy", "selsm"],
    "retrosum": ["--policy", "retrosum"],
    "precedent": ["--policy", "precedent"],
    "long-context": ["--policy", "long-context"],
    "none": ["--policy", "none"],
}
MODEL_RUNS = {"model-evo-medagent": ["--policy", "evo-medagent"]}
"""--backbone openai against the fake server, on the first N_MODEL_CASES cases."""
ENV_RUNS = {
    "env-medagentbench": ["--env", "medagentbench", "--funcs", str(MAB_FUNCS), "--patients", str(MAB_PATIENTS)],
    "env-agentclinic": [str(AC_MEDQA), "--env", "agentclinic", "--limit", "2"],
}
"""Sim backbone; the task file of env-medagentbench is written to a scratch folder (verify does not read it)."""


def _grandrounds(*args: str, env: dict | None = None) -> dict:
    # Content in clear (GRANDROUNDS_ENCRYPT=0): a sealed log would need the scratch database's key file to be
    # opened, and it is gone with the scratch folder. The fingerprint covers the plaintext either way.
    out = subprocess.run([sys.executable, "-m", "grandrounds", *args, "--json"], check=True, capture_output=True,
                         text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONHASHSEED="0", GRANDROUNDS_ENCRYPT="0", **(env or {})))
    return json.loads(out.stdout)


def _first_lines(path: Path, n: int, target: Path) -> Path:
    target.write_text("".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")
    return target


def _mab_tasks(target: Path) -> Path:
    tasks = [t for t in json.loads(MAB_TASKS.read_text(encoding="utf-8")) if t["id"] in MAB_TASK_IDS]
    target.write_text(json.dumps(tasks), encoding="utf-8")
    return target


def _fake_openai():
    """The fake OpenAI server the tests use (tests/ is not a package: imported by path)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from fake_openai_server import FakeOpenAI

    return FakeOpenAI()


def main(names: list[str]) -> int:
    known = [*RUNS, *MODEL_RUNS, *ENV_RUNS]
    unknown = sorted(set(names) - set(known))
    if unknown:
        print(f"unknown golden runs {unknown} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    wanted = [n for n in known if not names or n in names]
    if any(n in ENV_RUNS for n in wanted) and not DATA.is_dir():
        print(f"the environment runs read the shared data at {DATA}: not found", file=sys.stderr)
        return 2
    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cases = _first_lines(CASES, N_CASES, Path(tmp) / "cases.jsonl")
        model_cases = _first_lines(CASES, N_MODEL_CASES, Path(tmp) / "model_cases.jsonl")
        db = str(Path(tmp) / "golden.duckdb")
        for name in wanted:
            run_id = f"golden-{name}"
            if name in RUNS:
                summary = _grandrounds("run", str(cases), "--db", db, "--run-id", run_id, "--backbone", "sim",
                                       *RUNS[name])
            elif name in MODEL_RUNS:
                with _fake_openai() as server:  # the key is a placeholder: keys never enter events
                    summary = _grandrounds("run", str(model_cases), "--db", db, "--run-id", run_id, "--backbone",
                                           "openai", "--base-url", server.base_url, "--model", MODEL,
                                           *MODEL_RUNS[name], env={"OPENAI_API_KEY": "sk-golden-placeholder"})
            else:
                extra = ENV_RUNS[name]
                if name == "env-medagentbench":
                    extra = [str(_mab_tasks(Path(tmp) / "tasks.json")), *extra]
                summary = _grandrounds("run", *extra, "--db", db, "--run-id", run_id, "--backbone", "sim")
            target = GOLDEN / f"{name}.jsonl"
            part = target.with_suffix(".jsonl.tmp")
            _grandrounds("export", "--db", db, run_id, "--out", str(part), "--format", "jsonl")
            part.replace(target)  # atomic: a golden log is never half written
            print(f"{name:20s} {summary['events']:4d} events  {summary['fingerprint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
