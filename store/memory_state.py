"""What every run's memory shares, as a pure fold over its events; the policy's own memory is a part.

`MemoryState.apply` is the only way this state changes, and it reads nothing but the event:
replaying the log from seq 0 gives exactly the state the live path built incrementally.
Decisions are taken by handlers and arrive here already made, as events. Each policy's memory
(Evo-MedAgent's rules and episodes, SkeMex's skills, ...) is a part in its own package
(store/policy_memory.py), created and fed by the projection; the store knows none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grandrounds.store import event_types as ev
from grandrounds.store.errors import InvalidInput
from grandrounds.store.events import EventPayload


class RunClosed(InvalidInput, ValueError):
    """A case offered to a run that is complete: it said so (`run.completed`), or every case it declared
    has come in. A complete run is closed: bad input, refused before anything of the case is written."""


@dataclass
class MemoryState:
    cases_received: int = 0
    cases_completed: int = 0
    correct: int = 0
    last_seq: int = -1
    declared_cases: int | None = None
    """The case count `run.started` declared (None for runs written before runs declared it)."""
    run_completed: bool = False
    offered_tools: list[str] = field(default_factory=list)
    """The simulated tools `run.started` offered (a policy without tool governance reports them
    all at the default label)."""
    policy_memory: Any = None
    """The part holding the policy's memory (store/policy_memory.py); the projection folds it."""

    def apply(self, seq: int, payload: EventPayload) -> None:
        handler = _FOLD.get(type(payload))
        if handler is not None:
            handler(self, seq, payload)
        self.last_seq = seq

    def _run_started(self, seq: int, e: ev.RunStarted) -> None:
        self.declared_cases = e.cases
        self.offered_tools = sorted(e.tools)

    def _case_received(self, seq: int, e: ev.CaseReceived) -> None:
        self.cases_received += 1

    def _case_completed(self, seq: int, e: ev.CaseCompleted) -> None:
        self.cases_completed += 1
        self.correct += int(e.correct)

    def _run_completed(self, seq: int, e: ev.RunCompleted) -> None:
        self.run_completed = True

    def check_open(self, run_id: str, case_id: str) -> None:
        """Refuse a new case when the run is complete (`RunClosed`): a run that declared N cases holds N,
        and nothing follows its `run.completed` (before, a third case of a run of two was taken in and
        `verify` then called it whole)."""
        if self.run_completed or (self.declared_cases is not None and self.cases_received >= self.declared_cases):
            raise RunClosed(f"run {run_id!r} is complete ({self.cases_completed} of {self.declared_cases} declared "
                            f"cases{', run.completed written' if self.run_completed else ''}): case {case_id!r} is "
                            "not taken in; start another run (a new run id or namespace) for more cases")

    @property
    def completes_run(self) -> bool:
        """Whether the run has just completed its last declared case and not yet said so."""
        return (self.declared_cases is not None and not self.run_completed
                and self.cases_completed >= self.declared_cases)

    def counts(self) -> dict:
        """Memory counts for run summaries: the tools offered, then whatever the policy's part reports."""
        out: dict[str, Any] = {"tools": {name: "Caution" for name in self.offered_tools},
                               "tool_labels": {"Trusted": 0, "Caution": len(self.offered_tools), "Avoid": 0}}
        if self.policy_memory is not None:
            out.update(self.policy_memory.counts())
        return out


_FOLD = {
    ev.RunStarted: MemoryState._run_started,
    ev.CaseReceived: MemoryState._case_received,
    ev.CaseCompleted: MemoryState._case_completed,
    ev.RunCompleted: MemoryState._run_completed,
}
