"""`--lag k` against a slow model: throughput for k = 0, 1, 3, side by side, alternating.

    python benchmarks/bench_lag.py [--cases 24] [--delay 0.25] [--lags 0,1,3] [--rounds 2]
                                   [--policy evo-medagent --policy none] [--json]
                                   [--kafka | --broker kafka://HOST:PORT]

The model is tests/fake_openai_server.py with a fixed sleep per request (`--delay` seconds),
serving requests in parallel (one thread each, like a server with several slots), so the figures
are bound by the sleeps, not by this machine's CPU. Each run is a fresh DuckDB file, the `openai`
backbone, MiniLM embeddings (loaded once before timing), the example cases. Printed per policy and
k: cases/s and its ratio to k = 0, the model requests sent, how many replies the in-order pass was
served from the ahead pass, the most requests in flight at once, and the fingerprint (the same k
gives the same fingerprint in every round: checked).

With `--kafka` (a broker started here, in a temp folder, as `grandrounds kafka dev` does; stopped at the
end) or `--broker kafka://…` (one already running), every run is also made over Kafka, alternating with
the embedded ones: one `grandrounds worker` process (its own DuckDB file, the same fake model), the
run submitted and followed through the changelog as `run --broker` does, timed from the submit to its
last event imported. Its fingerprint must be the embedded run's for the same k (checked).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
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


def _served(store: EventStore, run_id: str) -> dict[str, int]:
    served: dict[str, int] = {}
    for e in store.iter(run_id, types=["llm.exchange"]):
        served[e.meta["served"]] = served.get(e.meta["served"], 0) + 1
    return served


def _row(seconds: float, n_cases: int, requests: int, served: dict[str, int], in_flight: int, fingerprint: str) -> dict:
    return {"seconds": seconds, "cases_per_s": n_cases / seconds, "requests": requests,
            "exchanges": sum(served.values()), "prefetched": served.get("prefetched", 0),
            "max_in_flight": in_flight, "fingerprint": fingerprint}


def one_run(server: FakeOpenAI, cases, policy: str, lag: int, directory: Path) -> dict:
    spec = RunSpec(policy=load_policy(policy), backbone="openai", model=MODEL, seed=0, lag=lag)
    before = len(server.requests)
    server.max_in_flight = 0
    with EventStore(directory / f"{policy}-lag{lag}-{time.monotonic_ns()}.duckdb") as store:
        t0 = time.perf_counter()
        outcome = run_cases(store, cases, spec, cache=make_cache(store),
                            backbone_options={"base_url": server.base_url, "api_key": "not-needed"})
        dt = time.perf_counter() - t0
        return _row(dt, len(cases), len(server.requests) - before, _served(store, outcome.summary["run_id"]),
                    server.max_in_flight, outcome.summary["fingerprint"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OverKafka:
    """One `grandrounds worker` process on a broker (started here with `start_broker`), taking the runs."""

    def __init__(self, bootstrap: str, server: FakeOpenAI, directory: Path):
        from grandrounds.streams.topics import Topics

        self.bootstrap = bootstrap
        self.server = server
        self.prefix = f"bench-lag-{os.getpid()}-{time.monotonic_ns()}."  # this benchmark's own topics and group
        self.topics = Topics(self.prefix)
        self.log = directory / "worker.log"
        with open(self.log, "ab") as log:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "grandrounds", "worker", "--broker", f"kafka://{bootstrap}",
                 "--db", str(directory / "worker.duckdb"), "--group", self.prefix + "g",
                 "--topic-prefix", self.prefix, "--base-url", server.base_url, "--quiet"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(os.environ, OPENAI_API_KEY="not-needed"))
        self.runs = 0

    def one_run(self, cases, policy: str, lag: int, timeout: float = 600.0) -> dict:
        from grandrounds.streams.producer import follow_run, submit_run

        if self.worker.poll() is not None:
            raise SystemExit(f"the worker exited ({self.worker.returncode}): see {self.log}")
        spec = RunSpec(policy=load_policy(policy), backbone="openai", model=MODEL, seed=0, lag=lag)
        self.runs += 1
        run_id = f"{policy}-lag{lag}-{self.runs}"
        before = len(self.server.requests)
        self.server.max_in_flight = 0

        async def go(store: EventStore) -> None:
            sub = await submit_run(self.bootstrap, run_id, spec, cases, topics=self.topics)
            await follow_run(self.bootstrap, sub, store, topics=self.topics, timeout=timeout)

        with EventStore(":memory:") as store:
            t0 = time.perf_counter()
            asyncio.run(go(store))
            dt = time.perf_counter() - t0
            return _row(dt, len(cases), len(self.server.requests) - before, _served(store, run_id),
                        self.server.max_in_flight, store.fingerprint(run_id))

    def close(self) -> None:
        if self.worker.poll() is None:
            self.worker.terminate()
            try:
                self.worker.wait(60)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait(10)


def start_broker(directory: Path):
    """A single-node broker in `directory` on free ports, as `grandrounds kafka dev` starts one."""
    from grandrounds.kafka_dev.broker import DevBroker
    from grandrounds.kafka_dev.jars import libs_dir

    libs = libs_dir()
    if libs is None:
        raise SystemExit("Kafka jars absent: run `grandrounds kafka fetch` (or bash .ci/kafka/fetch.sh) first")
    return DevBroker(libs, data=directory / "kafka", port=_free_port(), controller_port=_free_port()).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--delay", type=float, default=0.25, help="seconds the fake model sleeps per request")
    ap.add_argument("--lags", default="0,1,3")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policy", action="append", dest="policies")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--kafka", action="store_true", help="also over Kafka, on a broker started here")
    where.add_argument("--broker", help="also over Kafka, on this broker (kafka://HOST:PORT)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.broker and not args.broker.startswith("kafka://"):
        raise SystemExit("--broker takes kafka://HOST:PORT")
    lags = [int(x) for x in args.lags.split(",")]
    policies = args.policies or ["evo-medagent", "none"]
    cases = load_cases(ROOT / "examples" / "cases.jsonl")[0][:args.cases]
    directory = bench_dir("grandrounds-bench-lag-")
    modes = ["embedded"] + (["kafka"] if args.kafka or args.broker else [])
    rows: dict[tuple[str, str, int], list[dict]] = {}
    broker = kafka = None
    with FakeOpenAI(delay_s=args.delay) as server:
        try:
            if "kafka" in modes:
                broker = start_broker(directory) if args.kafka else None
                kafka = OverKafka(broker.bootstrap if broker else args.broker.removeprefix("kafka://"), server,
                                  directory)
            runners = {"embedded": lambda c, p, k: one_run(server, c, p, k, directory),
                       "kafka": lambda c, p, k: kafka.one_run(c, p, k)}
            for policy in policies:  # warm-up, not timed: loads MiniLM and embeds every text each k's run writes
                for lag in lags:
                    for mode in modes:
                        runners[mode](cases, policy, lag)
            for _ in range(args.rounds):
                for policy in policies:
                    for lag in lags:  # alternating, so a busy moment of the machine hits every k and mode alike
                        for mode in modes:
                            rows.setdefault((mode, policy, lag), []).append(runners[mode](cases, policy, lag))
        finally:
            if kafka is not None:
                kafka.close()
            if broker is not None:
                broker.stop()
    table = []
    for mode in modes:
        for policy in policies:
            base = statistics.median(r["cases_per_s"] for r in rows[(mode, policy, lags[0])])
            for lag in lags:
                runs = rows[(mode, policy, lag)]
                prints = {r["fingerprint"] for r in runs}
                if len(prints) != 1:
                    raise SystemExit(f"{mode} {policy} lag {lag}: fingerprints differ between rounds: {sorted(prints)}")
                if mode != "embedded" and prints != {rows[("embedded", policy, lag)][0]["fingerprint"]}:
                    raise SystemExit(f"{mode} {policy} lag {lag}: not the embedded run's fingerprint")
                cps = statistics.median(r["cases_per_s"] for r in runs)
                table.append({"mode": mode, "policy": policy, "lag": lag, "cases_per_s": round(cps, 3),
                              "ratio": round(cps / base, 2), "requests": runs[-1]["requests"],
                              "exchanges": runs[-1]["exchanges"], "prefetched": runs[-1]["prefetched"],
                              "max_in_flight": max(r["max_in_flight"] for r in runs),
                              "fingerprint": prints.pop()[:12]})
    if args.json:
        print(json.dumps({"cases": len(cases), "delay_s": args.delay, "rounds": args.rounds, "rows": table}))
        return
    print(f"{len(cases)} cases, fake model sleeping {args.delay} s per request, median of {args.rounds} rounds")
    print(f"{'mode':<9} {'policy':<13} {'lag':>3} {'cases/s':>8} {'× lag 0':>8} {'requests':>9} {'served ahead':>13} "
          f"{'in flight':>10}  fingerprint")
    for r in table:
        print(f"{r['mode']:<9} {r['policy']:<13} {r['lag']:>3} {r['cases_per_s']:>8.2f} {r['ratio']:>8.2f} "
              f"{r['requests']:>9} {r['prefetched']:>6}/{r['exchanges']:<6} {r['max_in_flight']:>10}  "
              f"{r['fingerprint']}")


if __name__ == "__main__":
    main()
