"""`--lag k` against a slow model: throughput for k = 0, 1, 3, side by side, alternating.

    python benchmarks/bench_lag.py [--cases 24] [--delay 0.25] [--lags 0,1,3] [--rounds 2]
                                   [--policy evo-medagent --policy none] [--json]

The model is tests/fake_openai_server.py with a fixed sleep per request (`--delay` seconds),
serving requests in parallel (one thread each, like a server with several slots), so the figures
are bound by the sleeps, not by this machine's CPU. Each run is a fresh DuckDB file, the `openai`
backbone, MiniLM embeddings (loaded once before timing), the example cases. Printed per policy and
k: cases/s and its ratio to k = 0, the model requests sent, how many replies the in-order pass was
served from the ahead pass, the most requests in flight at once, and the fingerprint (the same k
gives the same fingerprint in every round: checked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from benchmarks.common import bench_dir  # noqa: E402
from fake_openai_server import FakeOpenAI  # noqa: E402
from grandrounds.app import make_cache, run_cases  # noqa: E402
from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.config import load_policy  # noqa: E402
from grandrounds.handlers.runs import RunSpec  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402

MODEL = "fake-slow-model"


def one_run(server: FakeOpenAI, cases, policy: str, lag: int, directory: Path) -> dict:
    spec = RunSpec(policy=load_policy(policy), backbone="openai", model=MODEL, seed=0, lag=lag)
    before = len(server.requests)
    server.max_in_flight = 0
    with EventStore(directory / f"{policy}-lag{lag}-{time.monotonic_ns()}.duckdb") as store:
        t0 = time.perf_counter()
        outcome = run_cases(store, cases, spec, cache=make_cache(store),
                            backbone_options={"base_url": server.base_url, "api_key": "not-needed"})
        dt = time.perf_counter() - t0
        served: dict[str, int] = {}
        for e in store.iter(outcome.summary["run_id"], types=["llm.exchange"]):
            served[e.meta["served"]] = served.get(e.meta["served"], 0) + 1
    return {"seconds": dt, "cases_per_s": len(cases) / dt, "requests": len(server.requests) - before,
            "exchanges": sum(served.values()), "prefetched": served.get("prefetched", 0),
            "max_in_flight": server.max_in_flight, "fingerprint": outcome.summary["fingerprint"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--delay", type=float, default=0.25, help="seconds the fake model sleeps per request")
    ap.add_argument("--lags", default="0,1,3")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policy", action="append", dest="policies")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    lags = [int(x) for x in args.lags.split(",")]
    policies = args.policies or ["evo-medagent", "none"]
    cases = load_cases(ROOT / "examples" / "cases.jsonl")[0][:args.cases]
    directory = bench_dir("grandrounds-bench-lag-")
    rows: dict[tuple[str, int], list[dict]] = {}
    with FakeOpenAI(delay_s=args.delay) as server:
        for policy in policies:  # warm-up, not timed: loads MiniLM and embeds every text each k's run writes
            for lag in lags:
                one_run(server, cases, policy, lag, directory)
        for _ in range(args.rounds):
            for policy in policies:
                for lag in lags:  # alternating, so a busy moment of the machine hits every k alike
                    rows.setdefault((policy, lag), []).append(one_run(server, cases, policy, lag, directory))
    table = []
    for policy in policies:
        base = statistics.median(r["cases_per_s"] for r in rows[(policy, lags[0])])
        for lag in lags:
            runs = rows[(policy, lag)]
            prints = {r["fingerprint"] for r in runs}
            if len(prints) != 1:
                raise SystemExit(f"{policy} lag {lag}: fingerprints differ between rounds: {sorted(prints)}")
            cps = statistics.median(r["cases_per_s"] for r in runs)
            table.append({"policy": policy, "lag": lag, "cases_per_s": round(cps, 3),
                          "ratio": round(cps / base, 2), "requests": runs[-1]["requests"],
                          "exchanges": runs[-1]["exchanges"], "prefetched": runs[-1]["prefetched"],
                          "max_in_flight": max(r["max_in_flight"] for r in runs),
                          "fingerprint": prints.pop()[:12]})
    if args.json:
        print(json.dumps({"cases": len(cases), "delay_s": args.delay, "rounds": args.rounds, "rows": table}))
        return
    print(f"{len(cases)} cases, fake model sleeping {args.delay} s per request, median of {args.rounds} rounds")
    print(f"{'policy':<13} {'lag':>3} {'cases/s':>8} {'× lag 0':>8} {'requests':>9} {'served ahead':>13} "
          f"{'in flight':>10}  fingerprint")
    for r in table:
        print(f"{r['policy']:<13} {r['lag']:>3} {r['cases_per_s']:>8.2f} {r['ratio']:>8.2f} {r['requests']:>9} "
              f"{r['prefetched']:>6}/{r['exchanges']:<6} {r['max_in_flight']:>10}  {r['fingerprint']}")


if __name__ == "__main__":
    main()
