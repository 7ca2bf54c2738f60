"""`LLMGateway`: the one way a model is called. Hashes, sends, records, retries.

Each attempt becomes an `llm.exchange` event, emitted before the reply is returned (so
before anything parses or uses it). Latency and where the reply came from go in `meta`.
Retryable failures (rate limit, 5xx, timeout, connection) back off exponentially, honouring
`Retry-After`; others fail at once. Recorded replies are served without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from grandrounds.handlers.llm.errors import LLMUnavailable
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


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    backoff_s: float = 0.5
    """First wait; doubles per attempt."""
    max_backoff_s: float = 20.0

    def wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff_s)
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)


@dataclass(frozen=True)
class Reply:
    text: str
    usage: TokenUsage | None
    request_hash: str
    seq: int
    """Seq of the exchange event that recorded this reply."""


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
            common = dict(stage=recorder.stage, purpose=purpose, request_hash=h, model=self.model,
                          params=merged, messages=recorded_messages, attempt=attempt)
            if reply is not None:
                payload = LLMExchange(**common, outcome="ok", response=reply.text,
                                      finish_reason=reply.finish_reason, usage=reply.usage)
            else:
                payload = LLMExchange(**common, outcome="error", error=f"{failure.kind}: {failure.message}",
                                      retryable=failure.retryable)
            seq = recorder.emit(payload, {"latency_ms": latency_ms, "served": served})
            if reply is not None:
                return Reply(reply.text, reply.usage, h, seq)
            if not failure.retryable or attempt >= self.retry.max_attempts:
                raise LLMUnavailable(failure.kind, f"{failure.message} (after {attempt} attempt(s))")
            if served != "record":  # a recorded failure needs no waiting
                await asyncio.sleep(self.retry.wait(attempt, failure.retry_after))

    async def aclose(self) -> None:
        await self.transport.aclose()
