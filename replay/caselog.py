"""A recorded run as replay input: its spec (the first event) and its case log.

A run's case log is its `case.received` events in seq order; each carries the whole
validated case, so a run can be re-executed, or re-ordered, from its own log alone.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
from grandrounds.handlers.cases import Case, FhirCase
from grandrounds.handlers.environments.registry import case_kinds
from grandrounds.handlers.runs import RunSpec, read_spec
from grandrounds.store.event_types import CaseReceived, MemorySeeded
from grandrounds.store.eventstore import EventStore


class UnknownRun(InvalidInput, LookupError):
    """The named run has no events in this file (bad input: exit code 2)."""


def require_spec(store: EventStore, run_id: str) -> RunSpec:
    spec = read_spec(store, run_id)
    if spec is None:
        known = [r.run_id for r in store.runs()]
        hint = (f"runs in {store.path}: {', '.join(known[:8])}{' …' if len(known) > 8 else ''}"
                if known else f"{store.path} holds no runs")
        raise UnknownRun(f"no run {run_id!r} in {store.path} ({hint})")
    return spec


class NotReplayable(UnknownRun):
    """The run cannot be replayed as asked (bad input: exit code 2)."""


class ErasedCases(NotReplayable):
    """Cases of the run were erased (`grandrounds erase`): their content is gone, they cannot be re-executed."""

    def __init__(self, run_id: str, cases: list[str]):
        self.cases = cases
        shown = ", ".join(cases[:10]) + (" …" if len(cases) > 10 else "")
        super().__init__(f"run {run_id!r}: the content of {len(cases)} case(s) was erased and can no longer be "
                         f"re-executed: {shown}")


def _require_readable(store: EventStore, run_id: str) -> None:
    from grandrounds.store.erasure import erased_cases

    erased = erased_cases(store, run_id)
    if erased:
        raise ErasedCases(run_id, erased)


def case_log(store: EventStore, run_id: str) -> list[Case | FhirCase]:
    """The cases of a run in the order it received them. FHIR tasks (`FhirCase`) need the run's
    environment to be re-executed: `replay.environment` rebuilds it from the `run.started` meta."""
    _require_readable(store, run_id)
    cases: list[Case | FhirCase] = []
    kinds = case_kinds()
    for e in store.iter(run_id, types=[CaseReceived.event_type]):
        received = e.decode()
        assert isinstance(received, CaseReceived)
        served = kinds.get(received.case.get("kind"))  # a tool task: its environment's case model
        cases.append((served.case_class() if served else Case).model_validate(received.case))
    return cases


def seeded_memory(store: EventStore, run_id: str) -> MemorySeeded | None:
    """The memory an offline-mode run started from (its `memory.seeded` event), if any."""
    for e in store.iter(run_id, upto_seq=1, types=[MemorySeeded.event_type]):
        seeded = e.decode()
        assert isinstance(seeded, MemorySeeded)
        return seeded
    return None
