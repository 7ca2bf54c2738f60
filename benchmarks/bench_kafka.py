"""Kafka transport numbers (DESIGN §9, issue 4), against a real Apache Kafka broker.

    python benchmarks/bench_kafka.py [--cases 78] [--runs 8] [--repeat N] [--json] [--no-warmup]
                                     [--skip-restart] [--profile DIR] [--broker-prop K=V] [--broker-jvm OPT]

Starts a single-node Kafka 4.x broker from the jars of `.ci/kafka/fetch.sh` (its start time
is reported), warms a DuckDB embedding cache with one embedded run of the cases (so the
worker never embeds: the point is the transport, not MiniLM), then runs `grandrounds worker`
as a separate process and measures, with the sim backbone:

- end to end cases/s through the five topics, from the first produce of `submit` to the
  last `case.completed` seen on the changelog: one run alone, then --runs runs in parallel
  on the one worker (each run on its own partition). Before these, one unmeasured run
  warms the broker up (its JVM compiles its hot paths over the first thousands of
  requests; a broker in service has long done so) — `--no-warmup` leaves it out;
- CPU time per case of the worker, the broker and this process (the observer), which is
  steadier than wall time on a shared machine;
- per-stage latency p50/p99 from the worker: service (start of the stage → its DuckDB
  commit: stage, changelog ack, grouped commit) and hop (produce of the command → start of
  its processing: for a command the worker took up itself, ahead of its ack, the wait in the
  run's mailbox);
- restart: a worker SIGKILLed mid-run and started again (same name, same file) — seconds
  from the new process's start to its first new changelog batch;
- the worker's peak RSS; every run's fingerprint against the embedded runner's.
The sim backbone's accuracy means nothing clinically; only the timings matter here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402

from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.config import EvoMedAgentPolicy  # noqa: E402
from grandrounds.handlers.runs import RunSpec  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402
from grandrounds.streams.producer import submit_run  # noqa: E402
from grandrounds.streams.topics import Topics, ensure_topics, partition_for  # noqa: E402

PREFIX = "bench."
TOOLS = {"ddx-lookup": 0.85}


def run_ids(n: int, partitions: int = 8, prefix: str = "bench-") -> list[str]:
    """n run ids on n different partitions (so they run in parallel)."""
    out, used, i = [], set(), 0
    while len(out) < n:
        rid = f"{prefix}{i}"
        p = partition_for(rid, partitions)
        if p not in used or len(used) == partitions:
            out.append(rid)
            used.add(p)
        i += 1
    return out


class ChangelogWatch:
    """Tails the changelog; counts completed cases per run and notes when batches arrive."""

    def __init__(self, bootstrap: str, topics: Topics, partitions: int = 8):
        self.bootstrap, self.topics, self.partitions = bootstrap, topics, partitions
        self.completed: dict[str, int] = {}
        self.last_batch_at = 0.0
        self.batches = 0

    async def __aenter__(self):
        # Batched fetches (up to 25 ms apart) and no JSON decoding: the observer shares the two cores
        # with the broker and the worker, so it should take as little of them as it can. Its end
        # time can be late by up to one fetch wait.
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                         fetch_min_bytes=256 * 1024, fetch_max_wait_ms=25)
        await self.consumer.start()
        tps = [TopicPartition(self.topics.changelog, p) for p in range(self.partitions)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:
            await self.consumer.position(tp)
        return self

    async def __aexit__(self, *exc):
        await self.consumer.stop()

    async def poll(self, timeout_ms: int = 100) -> None:
        for records in (await self.consumer.getmany(timeout_ms=timeout_ms)).values():
            for rec in records:
                self.batches += 1
                self.last_batch_at = time.monotonic()
                # encode_batch writes compact JSON, so an event's type reads exactly like this (inside
                # a payload string the quotes would be escaped).
                done = rec.value.count(b'"type":"case.completed"')
                if done:
                    run_id = dict(rec.headers)["run_id"].decode()
                    self.completed[run_id] = self.completed.get(run_id, 0) + done

    async def until(self, cond, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"benchmark stalled: {self.completed}")
            await self.poll()


PROFILE_DIR: Path | None = None  # --profile: each worker process runs under cProfile


def spawn(bootstrap: str, db: Path, log: Path, name: str, profile: str | None = None) -> subprocess.Popen:
    prof = []
    if PROFILE_DIR is not None and profile is not None:
        prof = ["-m", "cProfile", "-o", str(PROFILE_DIR / f"{profile}.prof")]
    cmd = [sys.executable, *prof, "-m", "grandrounds", "worker", "--broker", f"kafka://{bootstrap}", "--db", str(db),
           "--group", PREFIX + "g", "--topic-prefix", PREFIX, "--name", name, "--json"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=open(log, "ab"), stdin=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return proc


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time a process has used so far (Linux /proc), 0.0 where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return 0.0


def thread_cpu(pid: int) -> list:
    """CPU seconds per thread (grouped by name) since the process started: shows where the CPU
    went — for the broker, JIT compiler threads against request handling."""
    agg: Counter = Counter()
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (t / "comm").read_text().strip()
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if t.name == str(pid):
            name = "main"
        elif comm.startswith("python"):  # Python's threads keep the process's name: tell them apart by id
            name = f"thread-{t.name}"
        else:  # JVM threads: "C1 CompilerThre", "data-plane-kafk"…, numbered per pool
            name = comm.rstrip("0123456789-_#")
        agg[name] += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return [(k, round(v, 2)) for k, v in agg.most_common(8)]


def wait_ready(log: Path, marker_count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count("ready in") < marker_count:
        if time.monotonic() > deadline:
            raise TimeoutError(log.read_text()[-2000:])
        time.sleep(0.05)


async def timed_runs(bootstrap: str, topics: Topics, spec, cases, ids: list[str]) -> tuple[float, dict]:
    """Seconds from the first produce of the submits to the last case.completed on the changelog."""
    async with ChangelogWatch(bootstrap, topics) as watch:
        t0 = time.monotonic()
        await asyncio.gather(*(submit_run(bootstrap, rid, spec, cases, topics=topics) for rid in ids))
        submitted = time.monotonic() - t0
        await watch.until(lambda: watch.batches > 0, 900)
        first = watch.last_batch_at - t0
        await watch.until(lambda: all(watch.completed.get(r, 0) >= len(cases) for r in ids), 900)
        total = time.monotonic() - t0
        return total, {"submit_returned_s": round(submitted, 2), "first_changelog_batch_s": round(first, 2)}


async def restart_time(bootstrap: str, topics: Topics, spec, cases, db: Path, log: Path) -> dict:
    ready_before = log.read_text(errors="replace").count("ready in")
    worker = spawn(bootstrap, db, log, "bench-w")
    wait_ready(log, ready_before + 1)
    rid = "bench-restart-run"
    async with ChangelogWatch(bootstrap, topics) as watch:
        await submit_run(bootstrap, rid, spec, cases, topics=topics)
        await watch.until(lambda: watch.completed.get(rid, 0) >= max(1, len(cases) // 3), 600)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        while True:  # read everything the killed worker wrote, so the next batch is the new one's
            before = watch.batches
            await watch.poll(500)
            if watch.batches == before:
                break
        seen = watch.batches
        started = time.monotonic()
        worker = spawn(bootstrap, db, log, "bench-w")
        await watch.until(lambda: watch.batches > seen, 120)
        back = watch.last_batch_at - started
        await watch.until(lambda: watch.completed.get(rid, 0) >= len(cases), 600)
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=60)
    return {"restart_to_processing_s": round(back, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=78, help="first N cases of examples/cases.jsonl (default: all 78)")
    ap.add_argument("--runs", type=int, default=8, help="parallel runs in the second measurement")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", metavar="DIR", help="run each phase's worker under cProfile; write DIR/<n>-<phase>.prof")
    ap.add_argument("--repeat", type=int, default=1, help="measure each phase N times; report the median (default 1)")
    ap.add_argument("--skip-restart", action="store_true", help="leave out the restart measurement")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="leave out the unmeasured warm-up run, so the first timed phase meets a cold broker JVM")
    ap.add_argument("--broker-prop", action="append", default=[], metavar="KEY=VALUE",
                    help="extra server.properties entry for the benchmark's broker (repeatable)")
    ap.add_argument("--broker-jvm", action="append", default=[], metavar="OPT",
                    help="extra JVM option for the benchmark's broker (repeatable), e.g. --broker-jvm=-XX:+UseSerialGC")
    args = ap.parse_args()
    global PROFILE_DIR
    if args.profile:
        PROFILE_DIR = Path(args.profile).resolve()
        PROFILE_DIR.mkdir(parents=True, exist_ok=True)

    from kafka_broker import KafkaBroker, java_executable, kafka_libs_dir

    if kafka_libs_dir() is None or java_executable() is None:
        sys.exit("needs the Kafka jars (bash .ci/kafka/fetch.sh) and java 17+")
    work = Path(tempfile.mkdtemp(prefix="grandrounds-bench-kafka-"))
    out: dict = {"cases": args.cases, "runs": args.runs, "backbone": "sim", "cpus": os.cpu_count(),
                 "loadavg_start": os.getloadavg()[0]}
    try:
        lines = (ROOT / "examples" / "cases.jsonl").read_text(encoding="utf-8").splitlines()[: args.cases]
        (work / "cases.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        cases, source = load_cases(work / "cases.jsonl")
        spec = RunSpec(policy=EvoMedAgentPolicy(), tools=TOOLS, source=source)

        # Warm embedding cache + the embedded runner's reference (and its speed, for scale).
        from grandrounds.app import run_cases

        warm = work / "warm.duckdb"
        with EventStore(warm) as store:
            run_cases(store, cases, spec, run_id="warm-up")  # embeds every text once
            t0 = time.monotonic()
            ref = run_cases(store, cases, spec, run_id="reference", commit="stage").summary
            out["embedded_stage_commit_cases_per_s"] = round(len(cases) / (time.monotonic() - t0), 1)

        props = dict(kv.split("=", 1) for kv in args.broker_prop)
        broker = KafkaBroker(extra_properties=props, jvm_opts=tuple(args.broker_jvm))
        out["broker_tuning"] = {"properties": props, "jvm": args.broker_jvm}
        broker.start()
        out["broker_start_s"] = round(broker.start_seconds, 2)
        try:
            boot, topics = broker.bootstrap, Topics(PREFIX)
            asyncio.run(ensure_topics(boot, topics, 8))
            db = work / "worker.duckdb"
            shutil.copyfile(warm, db)
            log = work / "worker.log"
            # Each measured phase --repeat times, with new run ids (a run id already processed would
            # only be skipped); the report keeps the median repetition and lists them all.
            phases = []
            for r in range(args.repeat):
                phases += [("one_run", [f"bench-single-{r}"]), ("parallel_runs", run_ids(args.runs, prefix=f"bench-{r}-"))]
            if args.warmup:
                phases.insert(0, ("warmup", ["bench-warmup"]))
            out["warmup"] = args.warmup
            measured: dict[str, list[dict]] = {}
            for n, (phase, phase_ids) in enumerate(phases, start=1):
                # A worker per phase, so its latency figures are that phase's alone.
                t_spawn = time.monotonic()
                worker = spawn(boot, db, log, "bench-w", profile=f"{n}-{phase}")
                wait_ready(log, n)
                if n == 1:
                    out["worker_start_to_ready_s"] = round(time.monotonic() - t_spawn, 2)
                cpu0 = {"worker": cpu_seconds(worker.pid), "broker": cpu_seconds(broker.pid),
                        "bench": time.process_time()}
                seconds, timeline = asyncio.run(timed_runs(boot, topics, spec, cases, phase_ids))
                cpu = {"worker": cpu_seconds(worker.pid), "broker": cpu_seconds(broker.pid), "bench": time.process_time()}
                timeline["cpu_ms_per_case"] = {k: round((cpu[k] - cpu0[k]) * 1000 / (len(phase_ids) * len(cases)), 2)
                                               for k in cpu}
                # Share of the machine's cores the three processes kept busy: near 1.0 the phase is
                # CPU-bound, and only less CPU per case makes it faster.
                timeline["cpu_utilisation"] = round(sum(cpu[k] - cpu0[k] for k in cpu) / (seconds * (os.cpu_count() or 1)), 2)
                threads = thread_cpu(worker.pid)
                worker.send_signal(signal.SIGTERM)
                stdout, _ = worker.communicate(timeout=60)
                stats = json.loads(stdout.decode().strip().splitlines()[-1])
                measured.setdefault(phase, []).append({"runs": len(phase_ids), "seconds": round(seconds, 2), **timeline,
                              "cases_per_s": round(len(phase_ids) * len(cases) / seconds, 1),
                              "stage_latency_ms": stats["latency_ms"], "worker_peak_rss_mb": stats["peak_rss_mb"],
                              "duckdb_commits": stats.get("commits"),
                              "redeliveries_skipped": stats["skipped_redeliveries"],
                              "own_deliveries": stats.get("own_deliveries", 0),
                              "echoes_dropped": stats.get("echoes", 0),
                              "embedding_cache_misses": stats.get("embedding_cache_misses"),
                              "worker_threads_cpu_s": threads, "run_ids": phase_ids})

            for phase, reps in measured.items():
                ranked = sorted(reps, key=lambda m: m["cases_per_s"])
                out[phase] = {**ranked[len(ranked) // 2], "repeats_cases_per_s": [m["cases_per_s"] for m in reps]}
            out["broker_threads_cpu_s"] = thread_cpu(broker.pid)
            with EventStore(db, read_only=True) as store:
                fps = {r: store.fingerprint(r) for reps in measured.values() for m in reps for r in m["run_ids"]}
            out["fingerprints_equal_embedded"] = all(f == ref["fingerprint"] for f in fps.values())

            if not args.skip_restart:
                out["restart"] = asyncio.run(restart_time(boot, topics, spec, cases, db, log))
        finally:
            broker.stop()
        out["loadavg_end"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(out))
        return
    print(f"Kafka transport, sim backbone, {args.cases} cases per run, {out['cpus']} CPUs "
          f"(load avg {out['loadavg_start']:.1f} → {out['loadavg_end']:.1f})")
    print(f"  broker start            {out['broker_start_s']:.2f} s")
    print(f"  worker start → ready    {out['worker_start_to_ready_s']:.2f} s")
    print(f"  embedded (stage commit) {out['embedded_stage_commit_cases_per_s']:.1f} cases/s (same process, no broker)")
    print(f"  warm-up run first       {'yes' if out['warmup'] else 'no (cold broker JVM)'}")
    for phase in ("one_run", "parallel_runs"):
        ph = out[phase]
        cpu = ph["cpu_ms_per_case"]
        reps = "" if len(ph["repeats_cases_per_s"]) == 1 else f" (median of {ph['repeats_cases_per_s']})"
        print(f"  {ph['runs']} run(s) end to end    {ph['cases_per_s']:.1f} cases/s{reps} ({ph['runs'] * args.cases} cases in "
              f"{ph['seconds']:.1f} s; worker peak RSS {ph['worker_peak_rss_mb']:.0f} MB; DuckDB transactions "
              f"{ph['duckdb_commits']['transactions']} for {ph['duckdb_commits']['stage_batches']} stage batches)")
        print(f"    CPU ms per case       worker {cpu['worker']}, broker {cpu['broker']}, observer {cpu['bench']} "
              f"(cores busy {ph['cpu_utilisation']:.0%}); "
              f"commands taken up on their produce ack: {ph['own_deliveries']}")
        print("    stage latency (ms)    service p50/p99      hop p50/p99")
        for stage, lat in ph["stage_latency_ms"].items():
            print(f"      {stage:<10} {lat['service_p50']:>10} / {lat['service_p99']:<10} {lat['hop_p50']:>8} / {lat['hop_p99']}")
    print("    (service: stage start → its DuckDB commit; hop: command produced → its processing starts (the\n"
          "     worker takes up the next stage itself, ahead of the ack, where it owns it); retrieve's hop includes\n"
          "     waiting for the previous case: a run's cases are all submitted up front)")
    if "restart" in out:
        print(f"  restart → processing    {out['restart']['restart_to_processing_s']:.2f} s "
              "(new process started → its first changelog batch; SIGKILLed mid-run, same --name and file)")
    print("  broker CPU by thread    " + ", ".join(f"{n} {v:.1f} s" for n, v in out["broker_threads_cpu_s"][:4])
          + " (whole benchmark)")
    print(f"  fingerprints = embedded {out['fingerprints_equal_embedded']}")


if __name__ == "__main__":
    main()
