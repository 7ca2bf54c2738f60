"""Serve the web view from a background thread (tests and the screenshot script): the same
app `grandrounds ui` serves, on 127.0.0.1 and a free port."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def serving(db: str | Path, timeout: float = 30.0) -> Iterator[str]:
    """Yields the base URL (http://127.0.0.1:PORT) while the app serves `db`; stops it on exit."""
    import uvicorn

    from grandrounds.ui.app import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(db), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the web view did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
