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
        [--out DIR] [--json OUT] [--results PATH]

Needs the local model (`grandrounds model fetch`, `pip install -e '.[local-model]'`) and ../shared/data.
One task takes minutes on one core: the default slice (one task of types 1 and 2, twice) ~15-25 minutes.
`--json OUT` writes the rows, the summary and where they were measured (benchmarks/provenance.py);
`--results PATH` the results document benchmarks/results/cache_prompt.json is (the table the docs page
renders, the command line, the load average before and after, that document raw).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_local_model  # noqa: E402  (a sibling script, not a package)
import provenance  # noqa: E402  (a sibling module)


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
    ap.add_argument("--results", default=None, metavar="PATH",
                    help="also write the results document (benchmarks/results/cache_prompt.json)")
    a = ap.parse_args(argv)
    if a.per_type < 1 or a.reps < 1:
        ap.error("--per-type and --reps must be at least 1")
    command = "python " + shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    where = provenance.measured()  # at the start: the code these runs measure
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        out = Path(a.out) if a.out else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cache-prompt-")))
        out.mkdir(parents=True, exist_ok=True)
        rows = []
        for rep in range(a.reps):
            for mode in ("off", "on"):  # alternating, so drift on a noisy machine hits both modes
                rows.append(measure(mode, rep, a, out, server))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    doc = {"rows": rows, **summary(rows), "measured": where}
    print("| mode | rep | tasks | correct | s/task | tokens/task | fingerprint | verify |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['rep']} | {r['tasks']} | {r['correct']} | {r['s_per_task']} | "
              f"{r['tokens_per_task']} | {r['fingerprint']} | {r['verified']} |")
    print(f"\ncache on: {doc['speedup']}x faster per task ({doc['s_per_task_off']} s -> {doc['s_per_task_on']} s); "
          f"same replies: {doc['same_replies']}; every run verified: {doc['all_verified']}")
    if a.json_out:
        bench_local_model.write_atomic(Path(a.json_out), json.dumps(doc, indent=1))
    if a.results:
        provenance.write_results(a.results, results_doc(doc, a, command, load_before, time.perf_counter() - t0))
    return 0


def results_doc(doc: dict, a, command: str, load_before: tuple[float, ...], wall_s: float) -> dict:
    """The results document: a row per run (cache off, then on, per repetition), its summary in "about"."""
    rows = doc["rows"]
    threads = f"{a.threads} thread{'s' if a.threads != 1 else ''}" if a.threads else "the local model's default threads"
    tasks = rows[0]["tasks"]
    correct = {r["mode"]: r["correct"] for r in rows}
    label = {"off": "`model serve` (cache off, the default)", "on": "`model serve --cache-prompt`"}
    load_after = os.getloadavg()
    fmt = ", ".join
    return {
        "title": "The local model's prompt cache, off then on",
        "about": (f"{tasks} official MedAgentBench task{'s' if tasks != 1 else ''} (type{'s' if ',' in a.types else ''} "
                  f"{a.types}, {a.per_type} per type), policy `none`, the local model (Qwen2.5-Coder-1.5B) on "
                  f"{threads}, cache off then on, {a.reps} pair{'s' if a.reps != 1 else ''} alternating. "
                  + (f"**{doc['speedup']}× faster per task** with the cache"
                     if doc["speedup"] and doc["speedup"] >= 1 else f"{doc['speedup']}× the speed per task with the cache")
                  + ("; here the replies were the same bytes (equal fingerprints). llama.cpp does not promise that, "
                     "so the default stays off." if doc["same_replies"] else
                     "; here the replies differed (the fingerprints differ): llama.cpp does not promise the same "
                     "bytes across cache states, which is why the default stays off.")
                  + (" Every run verified from its own record." if doc["all_verified"] else
                     " **Not every run verified** (see the verify column).")
                  + f" The model solved {correct.get('off', 0)} (cache off) and {correct.get('on', 0)} (cache on) of "
                    f"{tasks} per run" + (", so these rows are a speed measure, not a score." if not any(correct.values())
                                          else ".")),
        "source": command,
        "columns": [f"server ({threads})", "s/task", "tokens/task", "fingerprint", "verify"],
        "rows": [[label[r["mode"]] + (f", pair {r['rep'] + 1}" if a.reps > 1 else ""), f"{r['s_per_task']}",
                  f"{r['tokens_per_task']:,}", r["fingerprint"],
                  "identical" if r["verified"] is True else str(r["verified"])] for r in rows],
        "notes": [f"Load average (1, 5, 15 min) on {os.cpu_count()} cores: {fmt(f'{x:.2f}' for x in load_before)} "
                  f"before the run, {fmt(f'{x:.2f}' for x in load_after)} after it; the whole run (model starts and "
                  f"verifies included) took {wall_s / 60:.1f} min. s/task is the run alone, not its verify."],
        "measured": doc["measured"],
        "raw": {**doc, "wall_s": round(wall_s, 1), "cpus": os.cpu_count(),
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in load_after]},
    }


if __name__ == "__main__":
    os.environ.setdefault("OPENAI_API_KEY", "local")
    sys.exit(main())
