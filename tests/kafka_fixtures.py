"""Fixtures and helpers shared by the Kafka tests (tests/test_kafka_*.py).

    from kafka_fixtures import kafka_broker, kafka_warm  # noqa: F401

`kafka_broker`: one real Apache Kafka 4.x broker (KRaft, combined mode) for the session;
skips with the reason when the jars (`bash .ci/kafka/fetch.sh`) or java are missing.

`kafka_warm`: a small case file, the embedded runner's reference results for it, and a
DuckDB file whose embedding cache already holds every text those cases need. Each worker
gets a copy of that file, so no worker (in-process or subprocess) loads MiniLM or embeds.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kafka_broker import KafkaBroker, java_executable, kafka_libs_dir

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "cases.jsonl"
N_CASES = 40
TOOLS = {"ddx-lookup": 0.85}
SHORTER_RUNS = (2, 3, 4, 6)
"""Case counts of the shorter Kafka test runs: their embedded references are made up front."""


def _skip_reason() -> str | None:
    if kafka_libs_dir() is None:
        return "Kafka jars absent: run `bash .ci/kafka/fetch.sh` (Maven, network) first"
    if java_executable() is None:
        return "java not found (Kafka 4.x brokers need JDK 17+)"
    return None


@pytest.fixture(scope="session")
def kafka_broker():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    broker = KafkaBroker(num_partitions=8)
    broker.start()
    print(f"\nKafka broker at {broker.bootstrap} started in {broker.start_seconds:.1f}s")
    try:
        yield broker
    finally:
        broker.stop()


@dataclass
class WarmStore:
    db: Path
    """DuckDB file with the reference runs and a warm embedding cache: copy it, never write it."""
    cases_file: Path
    cases: list
    spec: object
    """RunSpec of the Kafka test runs (lag 0; `spec_with(lag=2)` for a lagged one)."""
    reference: dict
    """lag → the embedded runner's summary for (cases, spec with that lag)."""
    _shorter: dict = field(default_factory=dict)
    """(cases, lag) → fingerprint of the embedded run of the first `cases` cases."""

    def spec_with(self, **update):
        return self.spec.model_copy(update=update)

    def worker_db(self, directory: Path, name: str = "worker") -> Path:
        path = directory / f"{name}.duckdb"
        shutil.copyfile(self.db, path)
        return path

    def fingerprint_upto(self, cases: int, lag: int = 0) -> str:
        """The embedded runner's fingerprint for a run of the first `cases` cases.

        Not a prefix of the full reference run: `run.started` declares the run's case count and
        `run.completed` follows its last case, so a shorter run is its own embedded run (made once
        per (cases, lag), in a copy of the warm file so the embedding cache is reused)."""
        from grandrounds.app import run_cases
        from grandrounds.store.eventstore import EventStore

        if cases == len(self.cases):
            return self.reference[lag]["fingerprint"]
        key = (cases, lag)
        if key not in self._shorter:
            refs = self.db.with_name("shorter-refs.duckdb")
            if not refs.exists():
                shutil.copyfile(self.db, refs)

            def embedded() -> str:
                with EventStore(refs) as store:
                    return run_cases(store, self.cases[:cases], self.spec_with(lag=lag),
                                     run_id=f"reference-lag{lag}-n{cases}").summary["fingerprint"]

            # A thread of its own: async tests call this inside their running event loop.
            with ThreadPoolExecutor(1) as pool:
                self._shorter[key] = pool.submit(embedded).result()
        return self._shorter[key]


@pytest.fixture(scope="session")
def kafka_warm(tmp_path_factory) -> WarmStore:
    """Embedded reference runs over the first N_CASES example cases (embeds each text once)."""
    from grandrounds.app import run_cases
    from grandrounds.handlers.cases import load_cases
    from grandrounds.handlers.policies.config import EvoMedAgentPolicy
    from grandrounds.handlers.runs import RunSpec
    from grandrounds.store.eventstore import EventStore

    d = tmp_path_factory.mktemp("kafka-warm")
    cases_file = d / "cases.jsonl"
    lines = EXAMPLES.read_text(encoding="utf-8").splitlines()[:N_CASES]
    cases_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cases, source = load_cases(cases_file)
    spec = RunSpec(policy=EvoMedAgentPolicy(), tools=TOOLS, source=source)
    db = d / "warm.duckdb"
    reference = {}
    with EventStore(db) as store:
        for lag in (0, 2):  # lag 2: the worker pins memory as `run --lag 2` does (streams/lag.py)
            outcome = run_cases(store, cases, spec.model_copy(update={"lag": lag}), run_id=f"reference-lag{lag}")
            reference[lag] = outcome.summary
    warm = WarmStore(db, cases_file, cases, spec, reference)
    # The shorter runs the tests compare with, made now: a test that patches the backbone must not
    # see these reference cases go through its patch.
    for n in SHORTER_RUNS:
        warm.fingerprint_upto(n)
    return warm


def unique_prefix() -> str:
    """Topic prefix and group of one test: tests never see each other's topics or offsets."""
    return f"t{uuid.uuid4().hex[:8]}."


def run_ids_on_partitions(partitions: list[int], n_partitions: int = 8, stem: str = "run") -> list[str]:
    """Run ids that the default partitioner puts on the given partitions, in that order."""
    from grandrounds.streams.topics import partition_for

    out, i = [], 0
    for p in partitions:
        while partition_for(f"{stem}-{i}", n_partitions) != p:
            i += 1
        out.append(f"{stem}-{i}")
        i += 1
    return out


# --- in-process workers -------------------------------------------------------------------


@asynccontextmanager
async def running_worker(bootstrap: str, db: Path, prefix: str, **settings):
    from grandrounds.streams.kafka_app import KafkaWorkerApp, WorkerSettings

    opts = {"group_id": prefix + "g", "keep_step_log": True}
    opts.update(settings)
    app = KafkaWorkerApp(WorkerSettings(bootstrap, db=str(db), prefix=prefix, **opts))
    await app.start()
    try:
        yield app
    finally:
        if app.worker is not None and app.worker.accepting:
            await app.stop()


def completed_cases(store, run_id: str) -> int:
    return sum(1 for _ in store.iter(run_id, types=["case.completed"]))


async def wait_until(predicate, timeout: float, what: str, every: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(every)


async def changelog_tail(bootstrap: str, topics, partition: int):
    """A started consumer (no group) at the beginning of one changelog partition: a test follows a run's
    batches on it as they land (stop it when done)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    tail = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                            auto_offset_reset="earliest")
    await tail.start()
    tail.assign([TopicPartition(topics.changelog, partition)])
    await tail.seek_to_beginning()
    return tail


# --- subprocess workers --------------------------------------------------------------------


def spawn_worker(bootstrap: str, db: Path, prefix: str, log_path: Path, name: str | None = None,
                 extra: tuple[str, ...] = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "grandrounds", "worker", "--broker", f"kafka://{bootstrap}", "--db", str(db),
           "--group", prefix + "g", "--topic-prefix", prefix, *extra]
    if name:
        cmd += ["--name", name]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    finally:
        log.close()


def stop_worker(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def grandrounds(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grandrounds", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
