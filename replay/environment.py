"""The environment a recorded run of tool tasks (MedAgentBench FHIR) was made in, built again.

A FHIR run names its environment by content in its spec (`RunSpec.source` hashes the task selection,
the function specs, the patient snapshot and the server) and keeps where the files were in the
`run.started` meta (`EnvironmentRecord`). `grandrounds verify` and `grandrounds replay` re-execute such
a run against the same environment: the files are checked against the recorded hashes first, and a
missing or changed file is refused (`EnvironmentUnavailable`, bad input: exit code 2) rather than
re-executed against something else.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
from contextlib import AbstractContextManager

from grandrounds.handlers.cases import FhirCase
from grandrounds.handlers.environments.base import META_KEY, EnvironmentRecord
from grandrounds.handlers.environments.registry import case_kinds, open_recorded, record_from_meta
from grandrounds.handlers.plugins import RegistryError
from grandrounds.store.event_types import CaseReceived
from grandrounds.store.eventstore import EventStore


class EnvironmentUnavailable(InvalidInput, ValueError):
    """The run's environment cannot be built again as it was (bad input: exit code 2)."""


def recorded_environment(store: EventStore, run_id: str,
                         error: type[Exception] = EnvironmentUnavailable) -> EnvironmentRecord | None:
    """The environment a run was made in (`run.started` meta), or None for an MCQ run. A run holding
    FHIR tasks without that record cannot be re-executed (`error`)."""
    first = store.read(run_id, upto_seq=0)[0]
    data = first.meta.get(META_KEY)
    if data:  # the record's `name` picks its registered environment (handlers/environments/registry.py)
        try:
            return record_from_meta(data)
        except RegistryError as e:
            raise error(f"run {run_id!r}: {e}") from None
    for e in store.iter(run_id, types=[CaseReceived.event_type]):
        if e.payload["case"].get("kind") in case_kinds():
            raise error(f"run {run_id!r} holds {e.payload['case']['kind']} tasks but no record of the environment "
                        "they ran in: it cannot be re-executed")
        break
    return None


def fhir_case_log(store: EventStore, run_id: str) -> list[FhirCase]:
    """The tool tasks of a run (FHIR tasks; AgentClinic OSCE cases) in the order it received them."""
    from grandrounds.replay.caselog import _require_readable

    _require_readable(store, run_id)
    out = []
    for e in store.iter(run_id, types=[CaseReceived.event_type]):
        if e.payload["case"].get("kind") == "osce":
            from grandrounds.handlers.environments.agentclinic_osce import OsceCase

            out.append(OsceCase.model_validate(e.payload["case"]))
        else:
            out.append(FhirCase.model_validate(e.payload["case"]))
    return out


def source_matches(record: EnvironmentRecord, source: str | None, cases: list[FhirCase],
                   store: EventStore | None = None, depth: int = 8) -> bool:
    """Whether the record is the environment `source` names: the content hash of these cases in it, or,
    for a replay run (whose `source` names its parent run), the parent's environment, same content."""
    if record.source(cases) == source:
        return True
    if store is None or not source or depth == 0 or not store.has_run(source):
        return False
    parent = recorded_environment(store, source)
    parent_cases = fhir_case_log(store, source)
    if parent is None or parent.identity() != record.identity() or \
            sorted(c.case_id for c in parent_cases) != sorted(c.case_id for c in cases):
        return False
    from grandrounds.handlers.runs import read_spec

    spec = read_spec(store, source)
    return spec is not None and source_matches(parent, spec.source, parent_cases, store, depth - 1)


def check_environment(record: EnvironmentRecord, run_id: str, source: str | None, cases: list[FhirCase],
                      what: str = "verify", error: type[Exception] = EnvironmentUnavailable,
                      store: EventStore | None = None) -> None:
    """Refuse (`error`) unless the recorded files are still there with the same content and the record
    matches the run's spec (`source`, over the run's own case order; a replay run's, its parent's)."""
    if record.name == "agentclinic":
        for ref in record.refs():
            problem = ref.check()
            if problem:
                raise error(f"cannot rebuild the AgentClinic environment of run {run_id!r}: {problem}; "
                            f"{what} re-executes the run against the same case file")
    for ref in (() if record.name == "agentclinic" else (record.funcs, record.patients)):
        problem = ref.check() if ref is not None else None
        if problem:
            raise error(f"cannot rebuild the MedAgentBench environment of run {run_id!r}: {problem}; "
                        f"{what} re-executes the run against the same function specs and patient snapshot")
    if not source_matches(record, source, cases, store):
        raise error(f"run {run_id!r}: the environment recorded with it does not match its spec's source")


def reopen_environment(record: EnvironmentRecord, run_id: str, source: str | None, cases: list[FhirCase],
                       what: str = "verify", error: type[Exception] = EnvironmentUnavailable,
                       store: EventStore | None = None) -> AbstractContextManager:
    """The run's MedAgentBench environment built again (a fresh sandbox), once its files check out:
    a context manager that starts the sandbox on entry and stops it on exit."""
    check_environment(record, run_id, source, cases, what, error, store)
    return open_recorded(record)
