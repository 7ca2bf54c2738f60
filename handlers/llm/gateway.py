"""`LLMGateway`: the one way a model is called. Hashes, sends, records, retries.

What the model said is an `llm.exchange` event, emitted before the reply is returned (so before
anything parses or uses it): a reply, or a refusal of the request itself (400/404/422: a property of
the request, replayed as such). Latency and where the reply came from go in `meta`.

Transport failures (refused connection, timeout, 5xx, 429, malformed / non-JSON / HTML / truncated /
oversized body) are retried with bounded exponential backoff and full jitter, honouring `Retry-After`.
They are *not* events: an event enters the run's fingerprint, and a run that survived an outage must
end with the same fingerprint as one that never saw it (the model's answers are the same). Each failed
attempt goes instead to the `meta` of the exchange that finally succeeded (`failed_attempts`: kind,
message, latency, wait) and, through the recorder's `note_attempt`, to the `llm_attempts` side table,
which also keeps the attempts of a call that never succeeded (its case's events are not written).
When every attempt of a call fails, or the key is refused, the gateway raises `ModelOutage`: the run
stops and the same command resumes at that case later. Jitter changes only how long we wait, never
a payload. Recorded replies are served without sleeping.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from grandrounds.handlers.llm.errors import LLMUnavailable, ModelOutage
from grandrounds.handlers.llm.recorder import Recorder
from grandrounds.handlers.llm.transport import Call, RawReply, Transport, TransportFailure
from grandrounds.store.canonical import content_hash
from grandrounds.store.llm_events import LLMExchange, LLMMessage, TokenUsage


DEFAULT_MAX_TOKENS = 1024
"""Sent with every request that names no `max_tokens`: a weak model can repeat inside a JSON string
until its context is full (minutes on a CPU server); a bound makes that a short, recorded reply."""
DEFAULT_TIMEOUT_S = 300.0
"""Per attempt. A 2-core local server takes ~60 s for MedAgentBench's 3,300-token official prompt,
several times that under load; a hosted endpoint answers far sooner, so a generous bound costs nothing."""


_JITTER = random.Random()
"""Waiting only: seeded from the OS, never used for anything a payload holds."""


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    backoff_s: float = 1.0
    """First wait; doubles per attempt, then full jitter (a uniform fraction 0.5-1 of it)."""
    max_backoff_s: float = 20.0
    """Upper bound of any single wait, `Retry-After` included."""
    max_timeouts: int = 2
    """A server that hangs costs at most this many timeouts per call, not `max_attempts` of them."""

    def wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff_s)
        base = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
        return base * _JITTER.uniform(0.5, 1.0)


@dataclass(frozen=True)
class Reply:
    text: str
    usage: TokenUsage | None
    request_hash: str
    seq: int
    """Seq of the exchange event that recorded this reply."""


REQUEST_REFUSALS = frozenset({"bad_request", "other"})
"""Failure kinds that are the endpoint's answer to this very request (400, 404, 422, other 4xx):
recorded as an exchange and raised as `LLMUnavailable`. Every other kind is infrastructure."""


def request_hash(model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> str:
    return content_hash({"model": model, "messages": messages, "params": params})


@dataclass
class LLMGateway:
    transport: Transport
    model: str
    params: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.0})
    """Defaults sent with every request (per-call params override them)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    async def complete(self, messages: list[dict[str, str]], recorder: Recorder, purpose: str,
                       params: dict[str, Any] | None = None) -> Reply:
        merged = {**self.params, **params} if params else dict(self.params)
        merged.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        h = request_hash(self.model, messages, merged)
        recorded_messages = [LLMMessage(role=m["role"], content=m["content"]) for m in messages]
        failed: list[dict[str, Any]] = []
        timeouts = 0
        attempt = 0
        while True:
            attempt += 1
            call = Call(h, self.model, messages, merged, attempt, recorder.case_id, recorder.stage, purpose)
            t0 = time.perf_counter()
            failure: TransportFailure | None = None
            reply: RawReply | None = None
            try:
                reply = await self.transport.send(call)
            except TransportFailure as f:
                failure = f
            latency_ms = round((time.perf_counter() - t0) * 1000, 3)
            served = getattr(self.transport, "last_served", self.transport.served)
            fetched_ms = getattr(self.transport, "last_latency_ms", None)
            if fetched_ms is not None:  # fetched ahead (--lag): the model's latency then, not the serving's
                latency_ms = fetched_ms
            # `attempt` is 1 in every event: the event is the attempt that counted; infrastructure
            # retries before it live in its meta, so they cannot change the fingerprint.
            common = dict(stage=recorder.stage, purpose=purpose, request_hash=h, model=self.model,
                          params=merged, messages=recorded_messages, attempt=1)
            meta: dict[str, Any] = {"latency_ms": latency_ms, "served": served}
            if failed:
                meta["failed_attempts"] = failed
            if reply is not None:
                seq = recorder.emit(LLMExchange(**common, outcome="ok", response=reply.text,
                                                finish_reason=reply.finish_reason, usage=reply.usage), meta)
                return Reply(reply.text, reply.usage, h, seq)
            if failure.kind in REQUEST_REFUSALS:
                # The server refused this request (not a transport problem): the answer, recorded.
                recorder.emit(LLMExchange(**common, outcome="error", error=f"{failure.kind}: {failure.message}",
                                          retryable=False), meta)
                raise LLMUnavailable(failure.kind, failure.message)
            timeouts += failure.kind == "timeout"
            give_up = (not failure.retryable or attempt >= self.retry.max_attempts
                       or timeouts >= self.retry.max_timeouts)
            wait = 0.0 if give_up or served == "record" else self.retry.wait(attempt, failure.retry_after)
            row = {"attempt": attempt, "kind": failure.kind, "error": failure.message[:500],
                   "latency_ms": latency_ms, "wait_s": round(wait, 3)}
            failed.append(row)
            if served != "record":  # a failure served from an older log's record is not a new attempt
                recorder.note_attempt({**row, "purpose": purpose, "request_hash": h, "served": served})
            if give_up:
                raise ModelOutage(failure.kind, failure.message[:500], self.endpoint, attempt,
                                  recorder.case_id, recorder.stage)
            if wait:
                await asyncio.sleep(wait)

    @property
    def endpoint(self) -> str:
        return getattr(self.transport, "endpoint", None) or f"({self.transport.served})"

    async def aclose(self) -> None:
        await self.transport.aclose()
