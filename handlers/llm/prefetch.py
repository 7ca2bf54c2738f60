"""Replies fetched ahead: how `--lag k` overlaps the model calls of consecutive cases.

A lagged run executes each case twice over the same pinned memory (streams/lag.py): first ahead
of its turn, concurrently with the cases before it, through `PrefetchTransport.ahead` (the live
transport, every reply kept); then in case order, for real, through the `PrefetchTransport`
itself, which serves each request the ahead pass already sent from what came back, once, and
sends anything else live. Both passes build the same requests from the same inputs, so the
second is served without waiting; what the log records is the second pass's exchanges, in case
order, so the event bytes never depend on which reply arrived first. A reply that was not
fetched ahead (the ahead pass failed, or took another path) is simply fetched live.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque

from grandrounds.handlers.llm.transport import Call, RawReply, Transport


class _Ahead:
    """The live transport, keeping every reply it returns for the in-order pass."""

    def __init__(self, owner: "PrefetchTransport"):
        self._owner = owner
        self.served = owner.inner.served
        self.endpoint = getattr(owner.inner, "endpoint", None)

    async def send(self, call: Call) -> RawReply:
        t0 = time.perf_counter()
        reply = await self._owner.inner.send(call)  # a failure is the gateway's (it retries, or gives up)
        self._owner.keep(call, reply, (time.perf_counter() - t0) * 1000)
        return reply

    async def aclose(self) -> None:
        return None  # the in-order transport owns the connection


class PrefetchTransport:
    """Serves replies fetched ahead by (case, request hash), each once; sends the rest live."""

    def __init__(self, inner: Transport):
        self.inner = inner
        self.served = inner.served
        self.endpoint = getattr(inner, "endpoint", None)
        self.ahead = _Ahead(self)
        self.last_served = inner.served
        self.last_latency_ms: float | None = None
        """Set when a reply came from the ahead pass: how long the model took for it then (the
        gateway records that as the exchange's latency instead of the microseconds of serving it)."""
        self.hits = 0
        self.misses = 0
        self._ready: dict[tuple[str, str], deque[tuple[RawReply, float]]] = defaultdict(deque)

    def keep(self, call: Call, reply: RawReply, latency_ms: float) -> None:
        self._ready[(call.case_id, call.request_hash)].append((reply, latency_ms))

    def forget(self, case_id: str) -> None:
        """Drop what was fetched ahead for a case that is done (replies its in-order pass did not ask for)."""
        for key in [k for k in self._ready if k[0] == case_id]:
            del self._ready[key]

    async def send(self, call: Call) -> RawReply:
        key = (call.case_id, call.request_hash)
        queue = self._ready.get(key)
        if queue:
            reply, latency_ms = queue.popleft()
            if not queue:
                del self._ready[key]
            self.hits += 1
            self.last_served, self.last_latency_ms = "prefetched", round(latency_ms, 3)
            return reply
        self.misses += 1
        self.last_served, self.last_latency_ms = self.inner.served, None
        return await self.inner.send(call)

    async def aclose(self) -> None:
        await self.inner.aclose()
