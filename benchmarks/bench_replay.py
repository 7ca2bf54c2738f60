"""Replay and audit benchmark (DESIGN §9) on Evo-MedAgent's 2,500 ChestAgentBench questions.

    .venv/bin/python benchmarks/bench_replay.py [--workdir DIR] [--cases N] [--permutations K]
                                                [--workers W] [--seed S] [--json]

Phases, each on a fresh copy of the source file so no phase finds runs left by another:
  source   the source run `cab` (N cases, evo-medagent, sim), built once in DIR/source.duckdb;
           its first build embeds every text (cold: minutes) and is reused afterwards.
  warm-up  the K permutations replayed once into a throwaway copy, and the vectors they
           needed copied back into the source file: the timed phases run with a warm
           embedding cache (DESIGN §9), i.e. without loading MiniLM.
  1 proc   one permutation in this process: pure execution into an in-memory store, and end
           to end (`replay --workers 1`, import into the file included).
  2 procs  two permutations on two worker processes, end to end.
  K x N    `grandrounds replay --permutations K --workers W` as a user runs it (subprocess:
           interpreter start, workers, imports into the file, summary).
  audit    every audit query on the N-case run: the query alone (best of 3) and the CLI's
           wall time (subprocess, interpreter start included); verify and export too.
Peak memory: this process (ru_maxrss) and the largest child (RUSAGE_CHILDREN).
The sim backbone's accuracy is not a clinical measure; this measures throughput only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from grandrounds.handlers.environments.mcq_loaders import load_chestagentbench  # noqa: E402

DEFAULT_PATH = ROOT.parent / "shared" / "data" / "chestagentbench_evomedagent" / "real_cases.json"
from grandrounds.app import run_cases  # noqa: E402
from grandrounds.handlers.policies.config import EvoMedAgentPolicy  # noqa: E402
from grandrounds.handlers.runs import RunSpec  # noqa: E402
from grandrounds.replay.execute import execute  # noqa: E402
from grandrounds.replay.order_replay import execute_plan, plan_replay  # noqa: E402
from grandrounds.store.canonical import content_hash  # noqa: E402
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402
from grandrounds.store.read_model import EventLog  # noqa: E402

SOURCE = "cab"
CLI = [sys.executable, "-m", "grandrounds"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fresh_copy(src: Path, dst: Path) -> Path:
    """A copy of a database file with its key file (`<db>.keys`): without it the sealed case content
    of the copy reads as erased and the run cannot be replayed."""
    remove_db(dst)
    shutil.copyfile(src, dst)
    keys = Path(f"{src}.keys")
    if keys.exists():
        shutil.copyfile(keys, f"{dst}.keys")
    return dst


def remove_db(path: Path) -> None:
    path.unlink(missing_ok=True)
    Path(f"{path}.keys").unlink(missing_ok=True)


def build_source(path: Path, n: int) -> dict:
    cases = load_chestagentbench(DEFAULT_PATH, limit=n)
    with EventStore(path) as store:
        done = EventLog(store).completed_cases(SOURCE)
        if done == len(cases):
            return {"built": False, "cases": len(cases)}
        cache = EmbeddingCache(shared_minilm(), store.conn)
        spec = RunSpec(policy=EvoMedAgentPolicy(), source=content_hash([c.model_dump(mode="json") for c in cases]))
        t0 = time.perf_counter()
        out = run_cases(store, cases, spec, run_id=SOURCE, cache=cache, commit="case")
        return {"built": True, "cases": len(cases), "seconds": round(time.perf_counter() - t0, 1),
                "embedding_misses": cache.misses, "accuracy": out.summary["accuracy"]}


def warm_up(source: Path, work: Path, k: int, seed: int, workers: int) -> dict:
    tmp = fresh_copy(source, work / "warmup.duckdb")
    t0 = time.perf_counter()
    with EventStore(tmp) as store:
        plan = plan_replay(store, SOURCE, k, seed)
        result = execute_plan(store, EmbeddingCache(shared_minilm(), store.conn), plan, workers=workers)
    with EventStore(source) as store:
        before = store.conn.execute("SELECT count(*) FROM embedding_cache").fetchone()[0]
        store.conn.execute(f"ATTACH '{tmp}' AS w (READ_ONLY)")
        store.conn.execute("INSERT OR IGNORE INTO embedding_cache SELECT * FROM w.embedding_cache "
                           "WHERE key NOT IN (SELECT key FROM embedding_cache)")
        store.conn.execute("DETACH w")
        after = store.conn.execute("SELECT count(*) FROM embedding_cache").fetchone()[0]
    remove_db(tmp)
    return {"seconds": round(time.perf_counter() - t0, 1), "vectors_added": int(after - before),
            "fingerprints": [r["fingerprint"] for r in result["runs"]]}


def one_process(source: Path, work: Path, seed: int) -> dict:
    path = fresh_copy(source, work / "one.duckdb")
    with EventStore(path) as store:
        cache = EmbeddingCache(shared_minilm(), store.conn)
        plan = plan_replay(store, SOURCE, 1, seed)
        job = plan.runs[0].job
        t0 = time.perf_counter()
        cache.get(job.cases[0].question)  # persisted vectors load on first use: timed apart
        load = time.perf_counter() - t0
        misses0 = cache.misses
        with EventStore(":memory:") as scratch:
            t0 = time.perf_counter()
            execute(scratch, cache, job.run_id, job.spec, job.cases, checkpoint=False)
            pure = time.perf_counter() - t0
            fp = scratch.fingerprint(job.run_id)
        t0 = time.perf_counter()
        res = execute_plan(store, cache, plan, workers=1)
        e2e = time.perf_counter() - t0
        assert res["runs"][0]["fingerprint"] == fp
    n = len(job.cases)
    return {"cases": n, "execute_seconds": round(pure, 2), "execute_cases_per_s": round(n / pure, 1),
            "end_to_end_seconds": round(e2e, 2), "end_to_end_cases_per_s": round(n / e2e, 1),
            "cache_load_seconds": round(load, 2), "embedding_misses": cache.misses - misses0}


def two_workers(source: Path, work: Path, seed: int) -> dict:
    path = fresh_copy(source, work / "two.duckdb")
    with EventStore(path) as store:
        plan = plan_replay(store, SOURCE, 2, seed)
        t0 = time.perf_counter()
        res = execute_plan(store, EmbeddingCache(shared_minilm(), store.conn), plan, workers=2)
        dt = time.perf_counter() - t0
    n = sum(len(r.job.cases) for r in plan.runs)
    return {"cases": n, "seconds": round(dt, 2), "cases_per_s": round(n / dt, 1),
            "per_run_seconds": [r["seconds"] for r in res["runs"]]}


def cli(args: list[str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = subprocess.run(CLI + args + ["--json"], capture_output=True, text=True, cwd=ROOT)
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return dt, json.loads(out.stdout)


def k_by_n(source: Path, work: Path, k: int, seed: int, workers: int) -> dict:
    path = fresh_copy(source, work / "kxn.duckdb")
    dt, out = cli(["replay", "--db", str(path), "--from", SOURCE, "--permutations", str(k), "--seed", str(seed),
                   "--workers", str(workers)])
    return {"runs": k, "cases": out["cases"], "workers": workers, "wall_seconds": round(dt, 1),
            "accuracy_mean": out["accuracy_mean"], "accuracy_std": out["accuracy_std"],
            "accuracy_min": out["accuracy_min"], "accuracy_max": out["accuracy_max"],
            "fingerprints": [r["fingerprint"] for r in out["runs"]]}, path


def audit(path: Path, work: Path) -> dict:
    from grandrounds.replay.audit_diff import diff
    from grandrounds.replay.audit_explain import explain
    from grandrounds.replay.audit_history import history
    from grandrounds.replay.audit_items import items

    with EventStore(path, read_only=True) as store:
        log = EventLog(store)
        n = log.completed_cases(SOURCE)
        used = Counter(e.payload["source"].split(":", 1)[1] for e in log.events(SOURCE, types=["answer.given"], meta=False)
                       if e.payload["source"].startswith("rule:"))
        top_rule = min(used.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        episodes = log.of_type(SOURCE, "episode.stored")
        # the episode written halfway through the run (any --cases: there is one per case)
        mid_episode = episodes[len(episodes) // 2].payload["episode_id"]
        other = f"{SOURCE}-perm0-s{SEED[0]}"
        queries = {
            "items (head)": (lambda: items(store, SOURCE), ["audit", "items", SOURCE]),
            f"items --as-of-case {n // 2}": (lambda: items(store, SOURCE, as_of_case=n // 2),
                                             ["audit", "items", SOURCE, "--as-of-case", str(n // 2)]),
            f"history {top_rule} (most followed rule)": (lambda: history(store, SOURCE, top_rule),
                                                         ["audit", "history", SOURCE, top_rule]),
            f"history {mid_episode}": (lambda: history(store, SOURCE, mid_episode),
                                      ["audit", "history", SOURCE, mid_episode]),
            f"explain #{n - 1}": (lambda: explain(store, SOURCE, str(n - 1)), ["audit", "explain", SOURCE, str(n - 1)]),
            f"diff {SOURCE} {other}": (lambda: diff(store, SOURCE, other), ["audit", "diff", SOURCE, other]),
        }
        timings = {}
        for name, (fn, _) in queries.items():
            best = min(_timed(fn) for _ in range(3))
            timings[name] = {"query_seconds": round(best, 3)}
    for name, (_, args) in queries.items():
        dt, _ = cli(args + ["--db", str(path)])
        timings[name]["cli_wall_seconds"] = round(dt, 2)
    verify_copy = fresh_copy(path, work / "verify.duckdb")
    dt, out = cli(["verify", "--db", str(verify_copy), SOURCE])
    timings["verify (re-execute + compare)"] = {"cli_wall_seconds": round(dt, 2), "identical": out["identical"]}
    dt, _ = cli(["export", "--db", str(path), SOURCE, "--out", str(work / "cab.parquet")])
    timings["export parquet"] = {"cli_wall_seconds": round(dt, 2)}
    dt, _ = cli(["export", "--db", str(path), SOURCE, "--out", str(work / "cab.jsonl")])
    timings["export jsonl"] = {"cli_wall_seconds": round(dt, 2)}
    return timings


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


SEED = [0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/grandrounds-bench")
    ap.add_argument("--cases", type=int, default=2500)
    ap.add_argument("--permutations", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    SEED[0] = a.seed
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    source = work / f"source-{a.cases}.duckdb"
    report: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
                    "args": vars(a), "note": "sim backbone: throughput only, not a clinical measure"}
    log("source run …")
    report["source"] = build_source(source, a.cases)
    log(f"  {report['source']}\nwarm-up …")
    report["warm_up"] = warm_up(source, work, a.permutations, a.seed, a.workers)
    log(f"  {report['warm_up']['seconds']} s, {report['warm_up']['vectors_added']} vectors added\n1 process …")
    report["one_process"] = one_process(source, work, a.seed)
    log(f"  {report['one_process']}\n2 workers …")
    report["two_workers"] = two_workers(source, work, a.seed)
    log(f"  {report['two_workers']}\n{a.permutations} x {a.cases} …")
    report["k_by_n"], kxn_db = k_by_n(source, work, a.permutations, a.seed, a.workers)
    assert report["k_by_n"]["fingerprints"] == report["warm_up"]["fingerprints"], "replay results changed"
    log(f"  {report['k_by_n']['wall_seconds']} s\naudit …")
    report["audit"] = audit(kxn_db, work)
    for leftover in ("one.duckdb", "two.duckdb", "kxn.duckdb", "verify.duckdb"):
        remove_db(work / leftover)  # the phases' copies; the source file is kept for reuse
    for leftover in ("cab.parquet", "cab.jsonl"):
        (work / leftover).unlink(missing_ok=True)
    report["peak_rss_mb"] = {
        "this_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "largest_child": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    }
    if a.json:
        print(json.dumps(report, indent=2))
        return
    o, t, k = report["one_process"], report["two_workers"], report["k_by_n"]
    print(f"replay benchmark: {a.cases} ChestAgentBench cases, sim backbone, {os.cpu_count()} CPUs")
    print(f"  1 process   execute {o['execute_cases_per_s']} cases/s ({o['execute_seconds']} s), "
          f"end to end {o['end_to_end_cases_per_s']} cases/s   [target ≥ 300]  misses {o['embedding_misses']}")
    print(f"  2 workers   {t['cases_per_s']} cases/s aggregate ({t['cases']} cases in {t['seconds']} s)")
    print(f"  {k['runs']} x {k['cases']}   {k['wall_seconds']} s wall with {k['workers']} workers   [target < 120 s]  "
          f"accuracy {k['accuracy_mean']:.4f} ± {k['accuracy_std']:.4f} ({k['accuracy_min']:.4f}–{k['accuracy_max']:.4f})")
    print("  audit on the source run (query alone / CLI wall incl. interpreter start)   [target < 1 s]")
    for name, v in report["audit"].items():
        q = f"{v['query_seconds'] * 1000:7.0f} ms" if "query_seconds" in v else " " * 10
        print(f"    {name:<44} {q}   {v['cli_wall_seconds']:5.2f} s")
    print(f"  peak RSS    {report['peak_rss_mb']['this_process']} MB here, {report['peak_rss_mb']['largest_child']} MB largest child")
    print(f"  note: {report['note']}")


if __name__ == "__main__":
    main()
