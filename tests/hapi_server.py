"""A real HAPI FHIR JPA server for tests: the jars `.ci/hapi/fetch.sh` caches (HAPI FHIR 8.0.0, R4,
in-memory H2), `.ci/hapi/HapiServer.java` compiled against them, started on 127.0.0.1 and loaded
with the MedAgentBench patient snapshot in one transaction. Slow to boot (Spring + Hibernate: about
a minute on a quiet machine, several on a loaded one): one server per test module."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / ".ci" / "hapi" / "HapiServer.java"
HAPI_LIBS = Path(os.environ.get("HAPI_LIBS", Path.home() / ".cache" / "grandrounds" / "hapi-libs"))
BOOT_TIMEOUT_S = float(os.environ.get("GRANDROUNDS_HAPI_BOOT_S", "1500"))


def unavailable() -> str | None:
    if not shutil.which("java") or not shutil.which("javac"):
        return "no JDK (java, javac) on PATH"
    if not (HAPI_LIBS / ".complete").is_file():
        return f"HAPI FHIR jars not fetched (bash .ci/hapi/fetch.sh -> {HAPI_LIBS})"
    return None


def _classes() -> Path:
    key = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = HAPI_LIBS.parent / f"hapi-classes-{key}"
    if not (out / "HapiServer.class").is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        subprocess.run(["javac", "-d", str(tmp), "-cp", f"{HAPI_LIBS}/*", str(SOURCE)], check=True, timeout=600)
        tmp.replace(out) if not out.exists() else shutil.rmtree(tmp)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HapiServer:
    def __init__(self, log: Path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}/fhir/"
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> "HapiServer":
        cp = f"{_classes()}:{HAPI_LIBS}/*"
        out = open(self.log, "wb")
        self.proc = subprocess.Popen(["java", "-Xmx1500m", "-cp", cp, "HapiServer", str(self.port)],
                                     stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"HAPI server exited ({self.proc.returncode}); see {self.log}")
            if b"READY" in self.log.read_bytes()[-4096:]:
                return self
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"HAPI server not ready within {BOOT_TIMEOUT_S:.0f} s; see {self.log}")

    def load(self, patients: list[dict]) -> None:
        """Each patient PUT at its own id (HapiServer registers no system provider, so no transactions)."""
        for p in patients:
            req = urllib.request.Request(f"{self.base}Patient/{p['id']}", data=json.dumps(p).encode(), method="PUT",
                                         headers={"Content-Type": "application/fhir+json"})
            with urllib.request.urlopen(req, timeout=300) as r:  # noqa: S310 (127.0.0.1)
                assert r.status in (200, 201), p["id"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
