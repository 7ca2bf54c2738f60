"""The real local model as a pytest fixture (grandrounds/local_model.py).

`local_model` (session scope) starts the xllamacpp server on 127.0.0.1 once for the session and stops
it at the end. Where the weights or xllamacpp are absent the tests skip, saying which and how to get
it; CI (`.ci/run`) fetches both and sets GRANDROUNDS_REQUIRE_LOCAL_MODEL=1, which turns that skip into
a failure so a broken fetch cannot pass as "skipped".
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def local_model():
    from grandrounds.local_model import THREADS, LocalModelServer, model_path, unavailable_reason

    reason = unavailable_reason()
    if reason:
        if os.environ.get("GRANDROUNDS_REQUIRE_LOCAL_MODEL") == "1":
            pytest.fail(f"GRANDROUNDS_REQUIRE_LOCAL_MODEL=1 but {reason}")
        pytest.skip(reason)
    log = Path(tempfile.gettempdir()) / f"grandrounds-local-model-{os.getpid()}.log"
    # GRANDROUNDS_MODEL_THREADS: on a machine whose cores are already busy, 1 thread generates far faster
    # than 2 (llama.cpp's threads wait on each other at every step; measured 3.4 vs 0.1-0.3 tokens/s).
    threads = int(os.environ.get("GRANDROUNDS_MODEL_THREADS", THREADS))
    server = LocalModelServer(model_path(), threads=threads, log_file=log).start()
    try:
        yield server
    finally:
        server.stop()
