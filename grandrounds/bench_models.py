"""Model wiring shared by the benchmark commands (`agentclinic`, `medagentbench`).

`sim` needs nothing. `openai` builds a gateway on any OpenAI-compatible endpoint (key from
OPENAI_API_KEY, never logged or stored) and records every exchange into a run of `--db`.
`record` serves a recorded run's exchanges by request hash (no model calls) and records the
re-execution as a new run, whose fingerprint equals the source's when nothing diverged.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

from grandrounds.handlers.backbones import BackboneUnavailable
from grandrounds.handlers.llm.gateway import DEFAULT_TIMEOUT_S, LLMGateway, RetryPolicy
from grandrounds.handlers.llm.runlog import RunLog


@dataclass
class BenchModel:
    backbone: str
    """sim, openai or record."""
    gateway: LLMGateway | None
    log: RunLog | None
    note: str


def check_options(backbone: str, model: str | None, record_from: str | None) -> None:
    if backbone == "openai" and not model:
        raise BackboneUnavailable("--backbone openai needs --model")
    if backbone == "record" and not record_from:
        raise BackboneUnavailable("--backbone record needs --record-from RUN (a run of --db to serve)")


def _free_run_id(store, wanted: str | None, default: str) -> str:
    if wanted:
        if store.has_run(wanted):
            raise BackboneUnavailable(f"run {wanted!r} already exists in the database (give another --run-id)")
        return wanted
    run_id, n = default, 1
    while store.has_run(run_id):  # reruns with the default id get numbered, never appended to
        n += 1
        run_id = f"{default}-{n}"
    return run_id


@contextmanager
def bench_model(backbone: str, model: str | None, base_url: str | None, db: str | None, run_id: str | None,
                default_run_id: str, record_from: str | None = None, retry: RetryPolicy | None = None,
                timeout: float = DEFAULT_TIMEOUT_S):
    """Yields a `BenchModel` and closes the store afterwards. The caller closes the gateway
    (`await gateway.aclose()`) inside the event loop that used it: the HTTP client is bound to it."""
    if backbone == "sim":
        yield BenchModel("sim", None, None, "")
        return
    from grandrounds.handlers.backbones.build import live_transport
    from grandrounds.handlers.llm.record import RecordedExchanges, RecordedTransport
    from grandrounds.store.eventstore import EventStore

    check_options(backbone, model, record_from)
    if backbone == "openai":  # before the database is opened: a dead endpoint leaves nothing behind
        from grandrounds.handlers.backbones.build import endpoint_and_key
        from grandrounds.handlers.llm.preflight import preflight

        preflight(*endpoint_and_key(base_url, None), model)
    store = EventStore(db or ":memory:")
    try:
        if backbone == "record":
            if not store.has_run(record_from):
                raise BackboneUnavailable(f"--record-from: no run {record_from!r} in {db or 'the database'}")
            recorded = RecordedExchanges.from_store(store, record_from)
            first = next(iter(recorded.by_hash.values()), None)
            recorded_model = first[0].model if first else None
            if model and recorded_model and model != recorded_model:
                raise BackboneUnavailable(f"--model {model} differs from the recorded run's model {recorded_model}")
            transport = RecordedTransport(recorded)
            model = model or recorded_model or "unknown"
            run = _free_run_id(store, run_id, f"{record_from}-record")
            note = f"record backend: exchanges of run {record_from} served from {db}, no model calls"
        else:
            transport = live_transport(base_url, None, timeout)
            run = _free_run_id(store, run_id, default_run_id)
            where = base_url or os.environ.get("OPENAI_BASE_URL") or "api.openai.com"
            note = (f"openai backbone: model {model} at {where}; exchanges recorded as run {run} in "
                    f"{db or 'memory (pass --db to keep them)'}")
        gateway = LLMGateway(transport, model, params={"temperature": 0.0}, retry=retry or RetryPolicy())
        yield BenchModel(backbone, gateway, RunLog(store, run), note)
    finally:
        store.close()
