"""Worker processes that die with their parent.

`replay --workers N` runs permutations in spawned processes. If the parent is killed outright
(SIGKILL, the OOM killer), a `ProcessPoolExecutor` gets no chance to stop them: they would keep
running, holding memory and CPU, as orphans. Each worker therefore arranges its own end in its
initializer: on Linux the kernel sends it SIGKILL when its parent dies (`prctl(PR_SET_PDEATHSIG)`),
and everywhere a daemon thread watches the parent's pid and exits the process once it is gone
(re-parenting changes `os.getppid()`), which covers systems without prctl and the race where the
parent died before the prctl call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
WATCH_EVERY_S = 0.5


def die_with_parent(parent_pid: int) -> None:
    """Process-pool initializer: end this worker when `parent_pid` ends."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still applies
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="grandrounds-parent-watch", daemon=True).start()


def _watch(parent_pid: int) -> None:
    while True:
        time.sleep(WATCH_EVERY_S)
        if os.getppid() != parent_pid:
            os._exit(1)  # no cleanup: the parent that would receive our results is gone
