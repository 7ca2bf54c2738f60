"""A run log for benchmark commands that call models outside the pipeline (AgentClinic OSCE, MedAgentBench).

Each `llm.exchange` the gateway emits through a `Recorder` from here is appended to `run_id` in
the event store at once (one event per append, in call order), so the run can later be re-served
by the `record` backend (`RecordedExchanges.from_store(store, run_id)`), and token usage is tallied
per case and stage for the command's metrics. Benchmark outcomes themselves are the command's JSON
output, not events: these runs are not pipeline runs (no case.received, no memory).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from grandrounds.handlers.llm.recorder import Recorder
from grandrounds.store.attempts import note_attempt
from grandrounds.store.events import EventPayload, NewEvent
from grandrounds.store.llm_events import LLMExchange


class RunLog:
    def __init__(self, store, run_id: str):
        self.store = store
        self.run_id = run_id
        self.seq = store.last_seq(run_id)
        self.tokens: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        """case id -> stage -> prompt + completion tokens of its successful exchanges."""
        self.calls = 0
        self.attempts = 0
        self.failed_attempts = 0
        """Transport failures retried (kept in `llm_attempts`, not in the log)."""

    def recorder(self, case_id: str, stage: str) -> Recorder:
        def emit(payload: EventPayload, meta: dict[str, Any]) -> int:
            stored = self.store.append(self.run_id, [NewEvent(payload, case_id=case_id, meta=meta)], self.seq)
            self.seq = stored[-1].seq
            if isinstance(payload, LLMExchange):
                self.attempts += 1
                if payload.outcome == "ok":
                    self.calls += 1
                    if payload.usage is not None:
                        self.tokens[case_id][stage] += payload.usage.prompt_tokens + payload.usage.completion_tokens
            return self.seq

        def note(row: dict[str, Any]) -> None:
            self.failed_attempts += 1
            note_attempt(self.store, self.run_id, case_id, stage, row)

        return Recorder(case_id, stage, emit, note)

    def case_tokens(self, case_id: str, stages: tuple[str, ...] | None = None) -> int:
        per = self.tokens.get(case_id, {})
        return sum(n for s, n in per.items() if stages is None or s in stages)

    def summary(self) -> dict:
        prompt = completion = 0
        for e in self.store.iter(self.run_id, types=[LLMExchange.event_type]):
            usage = e.payload.get("usage") or {}
            prompt += int(usage.get("prompt_tokens", 0))
            completion += int(usage.get("completion_tokens", 0))
        return {"run_id": self.run_id, "calls": self.calls, "attempts": self.attempts + self.failed_attempts,
                "failed_attempts": self.failed_attempts,
                "prompt_tokens": prompt, "completion_tokens": completion,
                "fingerprint": self.store.fingerprint(self.run_id) if self.store.has_run(self.run_id) else None}
