"""Run a real single-node Apache Kafka 4.x broker (KRaft, no ZooKeeper) for tests.

The jars come from Maven Central through ``bash .ci/kafka/fetch.sh`` (no Maven) into
``$KAFKA_LIBS`` (default ``~/.cache/grandrounds/kafka-libs``); the broker runs as
``java -cp "$KAFKA_LIBS/*" kafka.Kafka server.properties`` from a temp dir.

    with KafkaBroker() as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        ...

``kill()`` then ``start()`` restarts the same broker (same ports, same data),
which is how a test simulates a broker crash; ``stop()`` also deletes its data.
No pytest here: callers wrap it in their own fixtures.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

# One readiness probe and JDK lookup for the test broker and `grandrounds kafka dev`.
from grandrounds.kafka_dev.broker import is_serving as _broker_is_serving, java_executable  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[1]
KAFKA_CI_DIR = REPO_ROOT / ".ci" / "kafka"
DEFAULT_KAFKA_LIBS = Path.home() / ".cache" / "grandrounds" / "kafka-libs"


class KafkaBrokerError(RuntimeError):
    """The broker could not be formatted or started; the message has its log tail."""


def kafka_libs_dir() -> Path | None:
    """The folder of Kafka jars written by .ci/kafka/fetch.sh (or `grandrounds kafka fetch`), or
    None if absent or incomplete: its ``.complete`` marker must hold the sha256 of the current jar
    list (grandrounds/kafka_dev/kafka-jars.txt), written only after every jar was checked."""
    from grandrounds.kafka_dev.jars import libs_dir

    libs = libs_dir()
    if libs is None or not any(libs.glob("kafka_2.13-*.jar")):
        return None
    return libs


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _random_cluster_id() -> str:
    # Same format as `kafka-storage.sh random-uuid` (Kafka's Uuid.toString: url-safe
    # base64 of 16 bytes, no padding), made here to save a JVM start. Kafka never
    # hands out ids starting with '-' (they read as CLI flags), so neither do we.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


class KafkaBroker:
    """A single-node KRaft broker+controller on 127.0.0.1 with its own temp dir."""

    def __init__(
        self,
        *,
        libs: Path | None = None,
        start_timeout: float = 60.0,
        num_partitions: int = 8,
        extra_properties: dict[str, str] | None = None,
        jvm_opts: tuple[str, ...] = (),
    ) -> None:
        self.libs = libs or kafka_libs_dir()
        if self.libs is None:
            raise KafkaBrokerError("Kafka jars not found: run `bash .ci/kafka/fetch.sh` first")
        java = java_executable()
        if java is None:
            raise KafkaBrokerError("java not found (Kafka 4.x brokers need JDK 17+)")
        self.java = java
        self.start_timeout = start_timeout
        self.port = _free_port()
        self.controller_port = _free_port()
        while self.controller_port == self.port:
            self.controller_port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="grandrounds-kafka-"))
        self.log_path = self.dir / "broker.log"
        self.cluster_id = _random_cluster_id()
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._formatted = False
        # C1 only (TieredStopAtLevel=1): a test or benchmark broker lives for seconds to minutes, and
        # on 2 cores C2's compiler threads took more CPU than the broker's request handling (5.2 s vs
        # 3.0 s over benchmarks/bench_kafka.py), starving the worker; C1-compiled code serves this
        # load with less CPU in total. A long-running production broker keeps the JVM's default.
        self.jvm_opts = ("-Xmx512m", "-Xms256m", "-XX:TieredStopAtLevel=1", *jvm_opts)
        self._write_properties(num_partitions, extra_properties or {})
        atexit.register(self._atexit)

    # -- public API ---------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> "KafkaBroker":
        """Format storage (first time only), start the JVM, wait until it serves."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        t0 = time.monotonic()
        if not self._formatted:
            self._format()
        log = open(self.log_path, "ab")
        try:
            self._proc = subprocess.Popen(
                self._java_cmd("kafka.Kafka", str(self.properties_path), jvm_opts=self.jvm_opts),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop()/kill() signal it whole
            )
        finally:
            log.close()
        deadline = t0 + self.start_timeout
        while True:
            if self._proc.poll() is not None:
                rc = self._proc.returncode
                self._proc = None
                raise KafkaBrokerError(f"Kafka broker exited with code {rc} while starting\n{self.log_tail()}")
            if _broker_is_serving(self.port):
                break
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.kill()
                raise KafkaBrokerError(
                    f"Kafka broker not serving on {self.bootstrap} after {self.start_timeout:.0f}s\n{tail}"
                )
            time.sleep(0.2)
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after ``timeout`` s; then delete the temp dir."""
        self._signal_and_wait(signal.SIGTERM, timeout)
        shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self._atexit)

    def kill(self) -> None:
        """SIGKILL the broker at once (a crash). The data stays: ``start()`` brings it back."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no broker log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> "KafkaBroker":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------

    @property
    def properties_path(self) -> Path:
        return self.dir / "server.properties"

    def _write_properties(self, num_partitions: int, extra: dict[str, str]) -> None:
        props = {
            # Combined mode: one JVM is both the broker and the only controller.
            "process.roles": "broker,controller",
            "node.id": "1",
            # Kafka 4 style dynamic quorum (KIP-853): bootstrap.servers instead of
            # controller.quorum.voters; needs `format --standalone` (see _format).
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            # The CONTROLLER entry lets clients that ask (admin DescribeQuorum) find it.
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            "num.partitions": str(num_partitions),
            "auto.create.topics.enable": "true",
            "group.initial.rebalance.delay.ms": "0",
            # Internal topics must fit one broker.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # 50 partitions each by default: creating them on first group/transaction
            # use costs seconds on a 2-core machine and buys a test nothing.
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.num.partitions": "4",
            # After kill() the restarted broker cannot register until the old
            # incarnation's session expires (DUPLICATE_BROKER_REGISTRATION, retried
            # every 2 s); the 9 s default made a crash-restart take ~12 s.
            "broker.session.timeout.ms": "4000",
            "broker.heartbeat.interval.ms": "500",
            # One network and one request-handler thread (defaults 3 and 8): on two cores shared with
            # the worker, fewer runnable threads mean fewer context switches; alternated benchmark
            # runs gave 8 runs 150–184 cases/s against 140–151 with the defaults (or 2 handlers).
            "num.network.threads": "1",
            "num.io.threads": "1",
        }
        props.update(extra)
        self.properties_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _java_cmd(self, main: str, *args: str, jvm_opts: tuple[str, ...] = ()) -> list[str]:
        cmd = [self.java, *jvm_opts]
        log4j2 = KAFKA_CI_DIR / "log4j2.properties"
        if log4j2.is_file():
            cmd.append(f"-Dlog4j2.configurationFile={log4j2}")
        # The classpath wildcard is expanded by java itself, not by a shell.
        return cmd + ["-cp", f"{self.libs}/*", main, *args]

    def _format(self) -> None:
        # Kafka 4.x refuses to start on unformatted log dirs. With
        # controller.quorum.bootstrap.servers, format must be told the initial
        # voter set; --standalone makes this node the sole voter.
        cmd = self._java_cmd(
            "kafka.tools.StorageTool", "format",
            "-t", self.cluster_id, "-c", str(self.properties_path), "--standalone",
            jvm_opts=("-XX:TieredStopAtLevel=1",),  # a one-shot tool: C2 would only burn CPU
        )
        res = subprocess.run(cmd, cwd=self.dir, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        with open(self.log_path, "ab") as log:
            log.write(b"$ kafka-storage format\n" + res.stdout + res.stderr)
        if res.returncode != 0:
            raise KafkaBrokerError(f"kafka storage format failed (rc={res.returncode})\n{self.log_tail()}")
        self._formatted = True

    def _signal_and_wait(self, sig: int, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def _atexit(self) -> None:
        # Safety net for an interrupted test run: never leave a JVM or data behind.
        self.stop(timeout=5.0)
