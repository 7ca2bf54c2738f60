"""What `grandrounds model serve --cache-prompt` buys on the official MedAgentBench protocol, side by side.

The official protocol re-sends its ~3,300-token prompt and the whole dialogue every round, so without a
prompt cache each round processes the task's prompt again. This script runs the same small slice of
`benchmarks/bench_local_model.py` (policy `none`, no AgentClinic) against the local model started twice
per repetition, cache off then cache on, on the same core, and prints per mode: wall seconds per task (the run alone, not its verify),
tokens per task, the test run's fingerprint and its `verify` result, then the off/on ratio of seconds per
task and whether both modes recorded the same replies (equal fingerprints). The replies may differ with
the cache on (llama.cpp does not promise byte-identical logits across cache states), which is why the
default server keeps it off; every run is verified from its own recorded exchanges either way.

    python benchmarks/bench_cache_prompt.py [--types 1,2] [--per-type 1] [--reps 1] [--threads N]
        [--out DIR] [--json OUT]

Needs the local model (`grandrounds model fetch`, `pip install -e '.[local-model]'`) and ../shared/data.
One task takes minutes on one core: the default slice (one task of types 1 and 2, twice) ~15-25 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_local_model  # noqa: E402  (a sibling script, not a package)


@contextlib.contextmanager
def local_model(cache_prompt: bool, threads: int | None):
    """The project's local model on a free port: (base_url, model name)."""
    from grandrounds.local_model import MODEL_ALIAS, LocalModelServer, fetch_model

    server = LocalModelServer(fetch_model(), cache_prompt=cache_prompt)
    if threads:
        server.threads = threads
    server.start()
    try:
        yield server.base_url, MODEL_ALIAS
    finally:
        server.stop()


def measure(mode: str, rep: int, a, out: Path, server=local_model) -> dict:
    db = out / f"{mode}-{rep}.duckdb"
    js = out / f"{mode}-{rep}.json"
    with server(mode == "on", a.threads) as (base_url, model):
        code = bench_local_model.main(["--base-url", base_url, "--model", model, "--per-type", str(a.per_type),
                                       "--types", a.types, "--osce", "0", "--policies", "none", "--db", str(db),
                                       "--json", str(js)])
    row = json.loads(js.read_text(encoding="utf-8"))["rows"][0]
    if code != 0 or "error" in row:
        raise SystemExit(f"the {mode} run failed: {row.get('error', code)}")
    return {"mode": mode, "rep": rep, "tasks": row["test_tasks"], "correct": row["correct"],
            "s_per_task": row["s_per_task"], "tokens_per_task": row["tokens_per_task"],
            "fingerprint": row["fingerprint"], "verified": row.get("verified")}


def summary(rows: list[dict]) -> dict:
    mean = {m: sum(r["s_per_task"] for r in rows if r["mode"] == m) / max(1, sum(r["mode"] == m for r in rows))
            for m in ("off", "on")}
    return {"s_per_task_off": round(mean["off"], 1), "s_per_task_on": round(mean["on"], 1),
            "speedup": round(mean["off"] / mean["on"], 2) if mean["on"] else None,
            "same_replies": len({r["fingerprint"] for r in rows}) == 1,
            "all_verified": all(r["verified"] is True for r in rows)}


def main(argv: list[str] | None = None, server=local_model) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="1,2", help="MedAgentBench task types (default 1,2)")
    ap.add_argument("--per-type", type=int, default=1, help="tasks per type (default 1)")
    ap.add_argument("--reps", type=int, default=1, help="off/on pairs, alternating (default 1)")
    ap.add_argument("--threads", type=int, default=None, help="server threads (default: the local model's)")
    ap.add_argument("--out", default=None, help="folder for the runs' databases (default: a temporary one)")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    if a.per_type < 1 or a.reps < 1:
        ap.error("--per-type and --reps must be at least 1")
    with contextlib.ExitStack() as stack:
        out = Path(a.out) if a.out else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cache-prompt-")))
        out.mkdir(parents=True, exist_ok=True)
        rows = []
        for rep in range(a.reps):
            for mode in ("off", "on"):  # alternating, so drift on a noisy machine hits both modes
                rows.append(measure(mode, rep, a, out, server))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    doc = {"rows": rows, **summary(rows)}
    print("| mode | rep | tasks | correct | s/task | tokens/task | fingerprint | verify |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['rep']} | {r['tasks']} | {r['correct']} | {r['s_per_task']} | "
              f"{r['tokens_per_task']} | {r['fingerprint']} | {r['verified']} |")
    print(f"\ncache on: {doc['speedup']}x faster per task ({doc['s_per_task_off']} s -> {doc['s_per_task_on']} s); "
          f"same replies: {doc['same_replies']}; every run verified: {doc['all_verified']}")
    if a.json_out:
        bench_local_model.write_atomic(Path(a.json_out), json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPENAI_API_KEY", "local")
    sys.exit(main())
