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

    python benchmarks/bench_lag.py --base-url http://127.0.0.1:18090/v1 --model qwen2.5-coder-1.5b-instruct
                                   [--cases 8] [--lags 0,1,3] [--rounds 2] [--policy none] [--timeout 1800] [--json]

With `--base-url URL --model NAME` no fake is started: the same k sweep runs against that
OpenAI-compatible endpoint (a real model: `grandrounds model serve --parallel N`, llama.cpp `-np N`)
on the real-model benchmark's recurring MCQ stream (benchmarks/bench_real_model.py's held-out file,
examples/recurring_test.jsonl, its first `--cases`), the answer decoding chosen as `grandrounds run
--actions auto` does (one json_schema probe). The warm-up is a `sim` run per policy (it loads MiniLM
and DuckDB, asks the model nothing). Printed per policy and k: seconds per case and cases/s (median),
the ratio to the first k, correct answers, replies served ahead, the fingerprint, and whether the
rounds of that k gave the same fingerprint. Only a one-slot server answers byte-identically: the
script reads the server's slot count from llama.cpp's `/props` and exits 1 if a one-slot server's
rounds disagree; with several slots concurrent requests are batched, replies may differ, and a
disagreement is reported, not failed (each run is still verified from its recorded exchanges).
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

from benchmarks import provenance  # noqa: E402
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


def _slots(base_url: str) -> int | None:
    """The server's parallel slots, from llama.cpp's `/props` (`total_slots`); None if it does not say."""
    import urllib.request

    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{root}/props", timeout=10) as r:
            slots = json.loads(r.read()).get("total_slots")
    except (OSError, ValueError, AttributeError):
        return None
    return slots if isinstance(slots, int) else None


def endpoint_run(base_url: str, model: str, actions: dict, timeout: float, cases, policy: str, lag: int,
                 directory: Path) -> dict:
    """One run of `cases` against a given OpenAI-compatible endpoint (no fake: nothing counted server-side)."""
    from grandrounds.handlers.llm.gateway import RetryPolicy

    spec = RunSpec(policy=load_policy(policy), backbone="openai", model=model, seed=0, lag=lag, actions=actions)
    with EventStore(directory / f"{policy}-lag{lag}-{time.monotonic_ns()}.duckdb") as store:
        t0 = time.perf_counter()
        outcome = run_cases(store, cases, spec, cache=make_cache(store),
                            backbone_options={"base_url": base_url, "timeout": timeout, "retry": RetryPolicy(),
                                              "api_key": os.environ.get("OPENAI_API_KEY", "not-needed")})
        dt = time.perf_counter() - t0
        served = _served(store, outcome.summary["run_id"])
        return {"seconds": dt, "cases_per_s": len(cases) / dt, "s_per_case": dt / len(cases),
                "exchanges": sum(served.values()), "prefetched": served.get("prefetched", 0),
                "correct": outcome.summary["correct"], "failed": outcome.summary.get("failed", 0),
                "fingerprint": outcome.summary["fingerprint"]}


def results_doc(table: list[dict], args, cases: int, modes: list[str]) -> dict:
    """The fake-model sweep as a results file for scripts/bench_docs.py (the models and benchmark pages)."""
    command = f"python benchmarks/bench_lag.py --cases {args.cases} --delay {args.delay} --lags {args.lags} " \
              f"--rounds {args.rounds}" + (" --kafka" if args.kafka else "") + " --results benchmarks/results/lag_fake_model.json"
    return {
        "title": "`--lag k` against a slow fake model, embedded" + (" and over Kafka" if "kafka" in modes else ""),
        "about": (f"{cases} example cases, the fake OpenAI-compatible server (tests/fake_openai_server.py) sleeping "
                  f"{args.delay} s a request and serving requests in parallel, `openai` backbone, MiniLM; k and mode "
                  f"alternating, median of {args.rounds} rounds after an untimed warm-up; a Kafka run is timed from "
                  "its submit to its last event imported. The ideal ratio is k + 1."),
        "source": command,
        "columns": ["mode", "policy", "k", "cases/s", "× k = 0", "served ahead", "most requests in flight",
                    "fingerprint"],
        "rows": [[r["mode"], r["policy"], str(r["lag"]), f"{r['cases_per_s']:.2f}", f"{r['ratio']:.2f}",
                  f"{r['prefetched']} of {r['exchanges']}", str(r["max_in_flight"]), r["fingerprint"]] for r in table],
        "notes": ["Each k gave one fingerprint in every round, and over Kafka the embedded run's (the script exits 1 "
                  "otherwise); different k, different fingerprints.",
                  "Every request was sent once: requests = recorded exchanges in every row."
                  if all(r["requests"] == r["exchanges"] for r in table) else
                  "Some rows sent more requests than they recorded: see raw."],
        "raw": {"rows": table},
    }


def endpoint_main(args, lags: list[int], policies: list[str]) -> int:
    """The k sweep against `--base-url` (see the module's doc); 1 if a one-slot server's rounds disagree."""
    from benchmarks.bench_real_model import TEST
    from grandrounds.backbone_choice import choose_actions

    cases = load_cases(TEST)[0][:args.cases]
    directory = bench_dir("grandrounds-bench-lag-")
    slots = _slots(args.base_url)
    actions = choose_actions("auto", args.model, args.base_url, args.timeout)  # as `run --actions auto`
    for policy in policies:  # warm-up, not timed, no model call: MiniLM, DuckDB, the policy's code
        with EventStore(directory / f"warmup-{policy}.duckdb") as store:
            run_cases(store, cases, RunSpec(policy=load_policy(policy), seed=0), cache=make_cache(store))
    rows: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.rounds):
        for policy in policies:
            for lag in lags:  # alternating, so a busy moment of the machine hits every k alike
                run = endpoint_run(args.base_url, args.model, actions, args.timeout, cases, policy, lag, directory)
                rows.setdefault((policy, lag), []).append(run)
                if not args.json:
                    print(f"  {policy} k={lag}: {run['s_per_case']:.2f} s/case, {run['correct']}/{len(cases)} correct, "
                          f"{run['prefetched']}/{run['exchanges']} served ahead, {run['fingerprint'][:12]}", flush=True)
    table = []
    for policy in policies:
        base = statistics.median(r["cases_per_s"] for r in rows[(policy, lags[0])])
        for lag in lags:
            runs = rows[(policy, lag)]
            prints = [r["fingerprint"] for r in runs]
            cps = statistics.median(r["cases_per_s"] for r in runs)
            table.append({"policy": policy, "lag": lag, "cases_per_s": round(cps, 4),
                          "s_per_case": round(statistics.median(r["s_per_case"] for r in runs), 2),
                          "ratio": round(cps / base, 2), "correct": [r["correct"] for r in runs],
                          "failed": [r["failed"] for r in runs], "exchanges": runs[-1]["exchanges"],
                          "prefetched": runs[-1]["prefetched"], "rounds_agree": len(set(prints)) == 1,
                          "fingerprints": [p[:12] for p in prints]})
    disagree = [r for r in table if not r["rounds_agree"]]
    if args.json:
        print(json.dumps({"base_url": args.base_url, "model": args.model, "slots": slots, "stream": TEST.name,
                          "cases": len(cases), "rounds": args.rounds, "actions": actions, "rows": table}))
    else:
        print(f"\n{len(cases)} cases of {TEST.name}, {args.model} at {args.base_url} "
              f"({slots if slots is not None else 'unknown'} slot(s)), {actions['mode']} answers, "
              f"median of {args.rounds} rounds")
        print(f"{'policy':<13} {'lag':>3} {'s/case':>7} {'cases/s':>8} {'× lag ' + str(lags[0]):>8} {'correct':>9} "
              f"{'served ahead':>13} {'rounds agree':>13}  fingerprint")
        for r in table:
            correct = ",".join(str(c) for c in r["correct"]) + f"/{len(cases)}"  # per round
            print(f"{r['policy']:<13} {r['lag']:>3} {r['s_per_case']:>7.2f} {r['cases_per_s']:>8.3f} {r['ratio']:>8.2f} "
                  f"{correct:>9} {r['prefetched']:>6}/{r['exchanges']:<6} {'yes' if r['rounds_agree'] else 'no':>13}  "
                  f"{' '.join(dict.fromkeys(r['fingerprints']))}")
        if disagree and slots != 1:
            print("rounds that disagree: a multi-slot server batches concurrent requests, so its replies can "
                  "differ between rounds (each run is still verified from its recorded exchanges)")
    if disagree and slots == 1:
        print(f"a one-slot server gave different fingerprints for the same k: "
              f"{[(r['policy'], r['lag']) for r in disagree]}", file=sys.stderr)
        return 1
    return 0


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
    ap.add_argument("--results", type=Path, default=None,
                    help="fake model only: write the sweep as a results file (benchmarks/results/lag_fake_model.json)")
    ap.add_argument("--base-url", help="run against this OpenAI-compatible endpoint instead of the fake (with --model)")
    ap.add_argument("--model", help="with --base-url: the model name requests carry")
    ap.add_argument("--timeout", type=float, default=1800.0, help="with --base-url: seconds per model request")
    args = ap.parse_args()
    if args.broker and not args.broker.startswith("kafka://"):
        raise SystemExit("--broker takes kafka://HOST:PORT")
    lags = [int(x) for x in args.lags.split(",")]
    policies = args.policies or ["evo-medagent", "none"]
    if args.base_url or args.model:
        if not (args.base_url and args.model):
            ap.error("--base-url and --model go together")
        if args.kafka or args.broker:
            ap.error("--base-url runs embedded only (not with --kafka / --broker)")
        sys.exit(endpoint_main(args, lags, policies))
    at = provenance.measured()  # before the run: the build measured
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
    if args.results:
        provenance.write_results(args.results, {**results_doc(table, args, len(cases), modes), "measured": at})
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
