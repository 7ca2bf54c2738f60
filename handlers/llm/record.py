"""The `record` backend: serve a recorded run's exchanges by request hash (DESIGN §3).

Attempts are served in the order they were recorded, per request hash, failures included:
a recorded 429 followed by a success is served as a 429 and then the success, so the
re-executed run emits the same events and gets the same fingerprint. A request the record
does not hold is a `ReplayDivergence` naming the case and stage — never a silent live call,
unless live fall-through was asked for.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from grandrounds.handlers.llm.errors import ReplayDivergence
from grandrounds.handlers.llm.transport import Call, RawReply, Transport, TransportFailure
from grandrounds.store.llm_events import LLMExchange


@dataclass
class RecordedExchanges:
    source_run: str
    by_hash: dict[str, deque[LLMExchange]]

    @classmethod
    def from_store(cls, store, run_id: str) -> "RecordedExchanges":
        if not store.has_run(run_id):
            raise ValueError(f"no recorded run {run_id!r} to serve exchanges from")
        by_hash: dict[str, deque[LLMExchange]] = defaultdict(deque)
        for e in store.iter(run_id, types=[LLMExchange.event_type]):
            x = e.decode()
            by_hash[x.request_hash].append(x)
        return cls(run_id, dict(by_hash))

    @property
    def remaining(self) -> int:
        return sum(len(q) for q in self.by_hash.values())


class RecordedTransport:
    served = "record"

    def __init__(self, recorded: RecordedExchanges, live: Transport | None = None):
        self.recorded = recorded
        self.live = live
        self.last_served = "record"

    async def send(self, call: Call) -> RawReply:
        queue = self.recorded.by_hash.get(call.request_hash)
        if not queue:
            if self.live is not None:
                self.last_served = "live-fallthrough"
                return await self.live.send(call)
            held = "an exhausted" if queue is not None else "no"
            raise ReplayDivergence(
                f"case {call.case_id}, stage {call.stage} ({call.purpose}, attempt {call.attempt}): run "
                f"{self.recorded.source_run!r} holds {held} recorded exchange for request "
                f"{call.request_hash[:16]}… — the re-execution diverged from the record "
                "(allow live fall-through to call the model instead)")
        self.last_served = "record"
        x = queue.popleft()
        if x.outcome == "error":
            kind, _, message = (x.error or "other: ").partition(": ")
            raise TransportFailure(kind, message, x.retryable)
        return RawReply(x.response or "", x.finish_reason, x.usage)

    async def aclose(self) -> None:
        if self.live is not None:
            await self.live.aclose()
