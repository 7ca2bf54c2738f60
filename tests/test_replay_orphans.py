"""`replay --workers N`: SIGKILL the parent and its worker processes go with it (no orphans)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay_fixtures import db_copy, recorded_db  # noqa: F401


def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(predicate, limit_s: float = 120.0) -> bool:
    end = time.monotonic() + limit_s  # a liveness bound on a loaded machine, not a timing claim
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkilled_replay_leaves_no_worker_processes(db_copy):
    parent = subprocess.Popen(
        [sys.executable, "-m", "grandrounds", "replay", "--db", str(db_copy), "--from", "src",
         "--permutations", "4", "--workers", "2", "--tag", "orphans", "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The pool's workers (spawned interpreters); multiprocessing's resource tracker may be there too.
        assert _wait_for(lambda: len(_children(parent.pid)) >= 2), "the replay never started its workers"
        workers = _children(parent.pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert _wait_for(lambda: not any(_alive(p) for p in workers)), \
            f"workers outlived their parent: {[p for p in workers if _alive(p)]}"
    finally:
        if parent.poll() is None:
            parent.kill()
        for p in _children(parent.pid):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
