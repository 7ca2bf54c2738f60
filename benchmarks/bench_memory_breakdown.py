"""Where resident memory goes as a run grows (issue 17 item 4): one in-process run, sampled every N cases.

    python benchmarks/bench_memory_breakdown.py [--cases 5000] [--every 1000] [--policy evo-medagent] [--json]

The example cases repeated under new ids (as bench_memory.py), sim backbone, MiniLM with a warm
cache (a 78-case run first embeds every text). Printed per sample, side by side: resident memory
(RSS), what DuckDB says it holds (`duckdb_memory()`), the Python heap (tracemalloc; numpy arrays
included, hnswlib's C++ graph not), the run's memory items, and, once, what the case file costs
held: parsed whole (`load_cases`, what `grandrounds run` did before) and streamed (`open_cases`, what
it does now: offsets only). The run reads the streamed one. The rest of RSS growth is the allocator's
and native libraries' (hnswlib builds its graph once a memory passes 4,096 items).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_memory import case_file  # noqa: E402
from benchmarks.common import bench_dir  # noqa: E402
from grandrounds.app import run_cases  # noqa: E402
from grandrounds.handlers.cases import load_cases, open_cases  # noqa: E402
from grandrounds.handlers.policies.config import load_policy  # noqa: E402
from grandrounds.handlers.runs import RunSpec  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--policy", default="evo-medagent")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = bench_dir("gr-bench-memory-breakdown-")
    path = case_file(work, a.cases)
    gc.collect()
    tracemalloc.start()
    parsed = load_cases(path)[0]
    case_list_mb = tracemalloc.get_traced_memory()[0] / 2 ** 20
    del parsed
    tracemalloc.stop()
    gc.collect()
    tracemalloc.start()
    cases = open_cases(path)[0]
    streamed_mb = tracemalloc.get_traced_memory()[0] / 2 ** 20
    tracemalloc.stop()
    store = EventStore(work / "run.duckdb")
    spec = RunSpec(policy=load_policy(a.policy))
    run_cases(store, cases[:78], spec, run_id="warm")  # loads MiniLM (if needed) and warms the cache
    gc.collect()
    start = rss_mb()
    tracemalloc.start()
    rows: list[dict] = []
    holder: dict = {}

    def on_case(index: int, ok: bool) -> None:
        if (index + 1) % a.every == 0:
            duck = store.conn.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0] or 0
            rows.append({"cases": index + 1, "rss_mb": round(rss_mb(), 1),
                         "rss_growth_mb": round(rss_mb() - start, 1),
                         "duckdb_mb": round(duck / 2 ** 20, 1),
                         "python_heap_mb": round(tracemalloc.get_traced_memory()[0] / 2 ** 20, 1)})

    import grandrounds.streams.embedded as embedded

    original = embedded.EmbeddedRunner.run

    async def run(self, cases, on_case=None):  # keep the context, to count the memory's items
        holder["ctx"] = self.ctx
        return await original(self, cases, on_case)

    embedded.EmbeddedRunner.run = run
    run_cases(store, cases, spec, run_id="big", on_case=on_case)
    counts = holder["ctx"].projection.state.counts()
    items = {k: v for k, v in counts.items() if isinstance(v, int)}
    out = {"policy": a.policy, "cases": a.cases, "case_list_mb": round(case_list_mb, 1),
           "case_list_kb_per_case": round(case_list_mb * 1024 / a.cases, 2),
           "streamed_case_file_mb": round(streamed_mb, 2),
           "streamed_kb_per_case": round(streamed_mb * 1024 / a.cases, 3), "memory_items": items, "samples": rows}
    if a.json:
        print(json.dumps(out))
        return
    print(f"{a.policy}, sim, {a.cases} cases; case file parsed whole {out['case_list_mb']} MB "
          f"({out['case_list_kb_per_case']} KB/case), streamed {out['streamed_case_file_mb']} MB "
          f"({out['streamed_kb_per_case']} KB/case); memory at the end: {items}")
    print(f"{'cases':>7} {'RSS MB':>8} {'growth':>8} {'DuckDB':>8} {'Py heap':>8}")
    for r in rows:
        print(f"{r['cases']:>7} {r['rss_mb']:>8} {r['rss_growth_mb']:>8} {r['duckdb_mb']:>8} {r['python_heap_mb']:>8}")


if __name__ == "__main__":
    main()
