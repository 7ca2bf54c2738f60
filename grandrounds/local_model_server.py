"""`python -m grandrounds.local_model_server`: the local model's HTTP server as its own process.

Loads the GGUF into `xllamacpp.Server` (llama.cpp's server, OpenAI-compatible `/v1/chat/completions`
and `/health`) on 127.0.0.1, prints `listening URL` on stdout once loaded, and serves until SIGTERM or
SIGINT. Settings are the ones that make temperature-0 replies byte-identical (../shared/LOCAL_MODEL.md):
prompt caching off (unless --cache-prompt), one slot (unless --parallel N: N slots, for `--lag k`
throughput; concurrent requests are then batched and replies may differ). Kept apart from local_model.py so importing the fetcher never loads
llama.cpp, and so the parent can stop the server with a signal like any server.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def build_params(model: str, port: int, threads: int, n_ctx: int, alias: str, cache_prompt: bool = False,
                 parallel: int = 1):
    """`n_ctx` is per slot: llama.cpp splits its context evenly across the `parallel` slots, so the
    server gets `n_ctx * parallel` and every slot keeps the prompt room one slot has."""
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = model
    p.model_alias = {alias}  # a set of names in this binding (a str would become a set of its letters)
    p.hostnames = ["127.0.0.1"]
    p.port = port
    p.n_ctx = n_ctx * parallel
    # One slot by default: requests are answered one at a time, so a temperature-0 reply does not
    # depend on what else was in flight. N slots answer N requests at once (what `--lag k` needs to
    # gain anything); their replies can then depend on the batching.
    p.n_parallel = parallel
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    # Off by default: with the cache on, the same request can get another reply after a warm-up, so a
    # rerun against the server is not byte-identical. On (--cache-prompt), a request that shares a
    # prefix with the slot's last one (the next round of a MedAgentBench task, the same system
    # prompt) skips that prefix's prompt processing; recorded exchanges still make verify and
    # replay exact, they never ask the server.
    p.cache_prompt = cache_prompt
    p.cache_ram_mib = 0
    p.use_jinja = True  # the GGUF's own chat template
    p.ui = False
    p.n_gpu_layers = 0
    return p


def main(argv: list[str] | None = None) -> int:
    from grandrounds.local_model import MODEL_ALIAS, N_CTX, THREADS

    ap = argparse.ArgumentParser(prog="python -m grandrounds.local_model_server")
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--ctx", type=int, default=N_CTX)
    ap.add_argument("--alias", default=MODEL_ALIAS)
    ap.add_argument("--cache-prompt", action="store_true")
    ap.add_argument("--parallel", type=int, default=1)
    args = ap.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    import xllamacpp

    server = xllamacpp.Server(build_params(args.model, args.port, args.threads, args.ctx, args.alias,
                                            args.cache_prompt, args.parallel))
    addr = server.listening_address
    url = addr if addr.startswith("http") else f"http://{addr}"
    print(f"listening {url.rstrip('/')}", flush=True)
    while not stop.wait(0.5):
        pass
    del server  # stops the HTTP threads and frees the model before the process exits
    return 0


if __name__ == "__main__":
    sys.exit(main())
