"""A single-node Apache Kafka 4.x broker (KRaft, combined broker+controller) on 127.0.0.1 for a
user's machine: `grandrounds kafka dev`. The same invocation as the test broker
(tests/kafka_broker.py): `kafka.tools.StorageTool format --standalone`, then `kafka.Kafka`, with
the jars on the classpath and the machine's JDK 17+. Data persists in its folder between starts.
"""

from __future__ import annotations

from grandrounds.store.errors import GrandroundsError
import base64
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from importlib import resources
from pathlib import Path

DEFAULT_DATA = Path.home() / ".cache" / "grandrounds" / "kafka-dev"


class BrokerError(GrandroundsError, RuntimeError):
    """The broker could not be formatted or started; the message carries its log tail."""


def java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home, "bin", "java"), os.X_OK):
        return str(Path(home, "bin", "java"))
    return shutil.which("java")


def is_serving(port: int, timeout: float = 2.0) -> bool:
    """Whether a broker on 127.0.0.1:port answers Metadata v4 with at least one broker.

    An open port is not enough: Kafka binds its listeners before it has caught up with the
    metadata log and before the controller unfences it, and a fenced broker is left out of
    Metadata responses. So send a raw Metadata v4 request (v0-v3 were removed in Kafka 4.0 by
    KIP-896; v4 is the oldest left and, not being a "flexible" version, the simplest to encode)
    and count the brokers. (The test broker, tests/kafka_broker.py, uses this probe too.)"""
    client_id = b"grandrounds-probe"
    req = struct.pack(">hhih", 3, 4, 7, len(client_id)) + client_id + struct.pack(">ib", -1, 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(req)) + req)
            head = b""
            while len(head) < 16:
                chunk = s.recv(16 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    _size, corr, _throttle, n_brokers = struct.unpack(">iiii", head)
    return corr == 7 and n_brokers > 0


def properties(port: int, controller_port: int, data: Path, partitions: int = 8) -> dict[str, str]:
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data / "logs"),
        "num.partitions": str(partitions),
        "auto.create.topics.enable": "true",
        "group.initial.rebalance.delay.ms": "0",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
    }


class DevBroker:
    """Format (first start only) and run one broker; `stop()` sends SIGTERM (a clean shutdown)."""

    def __init__(self, libs: Path, data: Path = DEFAULT_DATA, port: int = 9092, controller_port: int = 9093,
                 heap: str = "512m"):
        java = java_executable()
        if java is None:
            raise BrokerError("java not found (Apache Kafka 4.x needs a JDK 17+; apt-get install openjdk-17-jre-headless)")
        self.java, self.libs, self.data, self.port = java, libs, data, port
        self.controller_port = controller_port
        self.heap = heap
        self.log_path = data / "broker.log"
        self.properties_path = data / "server.properties"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _cmd(self, main: str, *args: str, jvm: tuple[str, ...] = ()) -> list[str]:
        log4j2 = resources.files("grandrounds.kafka_dev").joinpath("log4j2.properties")
        return [self.java, *jvm, f"-Dlog4j2.configurationFile={log4j2}", "-cp", f"{self.libs}/*", main, *args]

    def _format(self) -> None:
        if (self.data / "logs" / "meta.properties").is_file():
            return
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode().lstrip("-") or "grandrounds"
        res = subprocess.run(self._cmd("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                                       str(self.properties_path), "--standalone"),
                             cwd=self.data, stdin=subprocess.DEVNULL, capture_output=True, timeout=180)
        with open(self.log_path, "ab") as log:
            log.write(b"$ kafka-storage format\n" + res.stdout + res.stderr)
        if res.returncode != 0:
            raise BrokerError(f"kafka storage format failed (rc={res.returncode})\n{self.log_tail()}")

    def start(self, timeout: float = 120.0) -> "DevBroker":
        if is_serving(self.port, timeout=1.0):
            raise BrokerError(f"something already serves Kafka on {self.bootstrap}")
        self.data.mkdir(parents=True, exist_ok=True)
        props = properties(self.port, self.controller_port, self.data)
        self.properties_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self._format()
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self._cmd("kafka.Kafka", str(self.properties_path),
                                                   jvm=(f"-Xmx{self.heap}", "-Xms128m")),
                                         cwd=self.data, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not is_serving(self.port):
            if self.proc.poll() is not None:
                raise BrokerError(f"the broker exited with code {self.proc.returncode} while starting\n"
                                  f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the broker is not serving on {self.bootstrap} after {timeout:.0f} s\n"
                                  f"{self.log_tail()}")
            time.sleep(0.3)
        return self

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"
