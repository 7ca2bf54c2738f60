"""`grandrounds run TASKS.json --env medagentbench`: MedAgentBench FHIR tasks through the five stages.

Validates the options and the task file before anything runs (exit 2 naming the problem), names the
environment in the run's spec (`EnvironmentRecord`: hashed into `RunSpec.source`; the files' paths go
to the `run.started` meta so `grandrounds verify` can build the environment again), and summarises the
run per task type.

Task types 4-7, 9 and 10 read lab Observations the patient snapshot does not hold: the local sandbox
cannot grade them. With the sandbox they are refused up front (asked for with `--task-type`) or left
out (the default selection is then the offline-gradable types 1, 2, 3, 8); `--fhir-base URL` (the
MedAgentBench docker server) grades every type.
"""

from __future__ import annotations

import json
from pathlib import Path

from grandrounds.handlers.environments.run_setup import EnvRunSetup, refuse_unsupported
from grandrounds.handlers.cases import CaseFileError, FhirCase
from grandrounds.handlers.environments.base import EnvironmentRecord, FileRef

SUPPORTED_POLICIES = ("evo-medagent", "none", "skemex", "selsm", "retrosum")
"""Policies whose stages handle FHIR tasks (every shipped one); another refuses them up front."""
SIM_NOTE = ("sim agent: scripted for the official MedAgentBench task templates, not a model; its accuracy is "
            "not a clinical measure")


def _open(record: EnvironmentRecord):
    from grandrounds.handlers.environments.medagentbench.environment import open_environment

    return open_environment(record)


def mab_options_given(funcs, patients, fhir_base, task_types, limit) -> list[str]:
    given = [("--funcs", funcs), ("--patients", patients), ("--fhir-base", fhir_base),
             ("--task-type", task_types), ("--limit", limit)]
    return [name for name, value in given if value]


def looks_like_task_file(path: str) -> bool:
    """A MedAgentBench task file is one JSON array; a case file is JSON lines."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(256).lstrip()
    except (OSError, UnicodeDecodeError):
        return False
    return head.startswith("[")


def load_fhir_tasks(path: str, task_types: tuple[int, ...] | None, limit: int | None) -> list[FhirCase]:
    from pydantic import ValidationError

    from grandrounds.handlers.environments.medagentbench import task_case

    p = Path(path)
    if not p.is_file():
        raise CaseFileError(path, None, None, "file not found")
    try:
        items = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CaseFileError(path, None, None, f"not a MedAgentBench task file: not valid JSON ({exc.msg} at line "
                                              f"{exc.lineno})") from None
    except UnicodeDecodeError as exc:
        raise CaseFileError(path, None, None, f"not UTF-8 text ({exc.reason})") from None
    if not isinstance(items, list) or not items:
        raise CaseFileError(path, None, None, "a MedAgentBench task file is a non-empty JSON array of tasks")
    cases: list[FhirCase] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"task #{i + 1}"
        if not isinstance(item, dict):
            raise CaseFileError(path, None, where, "a task must be a JSON object")
        for key in ("id", "instruction"):
            if not isinstance(item.get(key), str):
                raise CaseFileError(path, None, f"{where}.{key}", "missing or not a string")
        try:
            case = task_case(item)
        except ValueError as exc:  # includes pydantic's ValidationError
            msg = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise CaseFileError(path, None, f"{where} ({item['id']})", msg) from None
        if case.case_id in seen:
            raise CaseFileError(path, None, f"{where}.id", f"duplicate task id {item['id']!r}")
        seen.add(case.case_id)
        if not task_types or case.task_type in task_types:
            cases.append(case)
    cases = cases[:limit] if limit else cases
    if not cases:
        raise CaseFileError(path, None, None, f"no tasks of type {', '.join(map(str, task_types or ()))} in file")
    return cases


def prepare_medagentbench(tasks: str, funcs: str | None, patients: str | None, fhir_base: str | None,
                          task_types: tuple[int, ...], limit: int | None, policy_name: str,
                          sim_tools: tuple[str, ...], broker: str, protocol: str = "official",
                          max_rounds: int | None = None) -> EnvRunSetup:
    """Everything checked before a run starts; ValueError / CaseFileError name the problem (exit 2)."""
    from grandrounds.handlers.environments.medagentbench import OFFLINE_TASK_TYPES, load_functions

    if not funcs:
        raise ValueError("--env medagentbench needs --funcs FILE (funcs_v1.json, the FHIR function specs)")
    if not patients and not fhir_base:
        raise ValueError("--env medagentbench needs --patients FILE (patients_from_snapshot.json, served by the "
                         "local sandbox) or --fhir-base URL (a real MedAgentBench FHIR server)")
    if patients and fhir_base:
        raise ValueError("give either --patients (local sandbox) or --fhir-base URL, not both")
    refuse_unsupported("medagentbench", "FHIR tasks", policy_name, SUPPORTED_POLICIES, sim_tools,
                       "FHIR tasks use the environment's FHIR functions", broker)
    if max_rounds and protocol != "official":
        raise ValueError("--max-rounds counts official-protocol replies: with --protocol react use --max-steps")
    if fhir_base and not fhir_base.startswith(("http://", "https://")):
        raise ValueError(f"--fhir-base {fhir_base!r} is not an http(s) URL")
    notes: list[str] = []
    if not fhir_base:
        offline_only = set(OFFLINE_TASK_TYPES)
        refused = sorted(set(task_types) - offline_only)
        if refused:
            which = f"task type {refused[0]} reads" if len(refused) == 1 else \
                f"task types {', '.join(map(str, refused))} read"
            raise ValueError(
                f"{which} lab data the patient snapshot lacks: the local "
                "sandbox cannot grade them; give --fhir-base URL (the MedAgentBench FHIR server) or choose "
                f"--task-type from {', '.join(map(str, OFFLINE_TASK_TYPES))}")
        if not task_types:
            task_types = OFFLINE_TASK_TYPES
            notes.append("local sandbox: task types 1, 2, 3, 8 (the others need --fhir-base)")
    for flag, path in (("--funcs", funcs), ("--patients", patients)):
        if path and not Path(path).is_file():
            raise CaseFileError(path, None, None, f"file not found ({flag})")
    cases = load_fhir_tasks(tasks, tuple(task_types) or None, limit)
    try:
        load_functions(funcs)
    except (ValueError, KeyError, TypeError) as exc:
        raise CaseFileError(funcs, None, None, f"not a MedAgentBench function file ({exc})") from None
    if patients:
        from grandrounds.sandbox.fhir_server import load_patients

        try:
            load_patients(patients)
        except json.JSONDecodeError as exc:
            raise CaseFileError(patients, None, None, f"not valid JSON ({exc.msg})") from None
        except ValueError as exc:
            raise CaseFileError(patients, None, None, str(exc)) from None
    record = EnvironmentRecord(funcs=FileRef.of(funcs), patients=FileRef.of(patients) if patients else None,
                               fhir_base=fhir_base, protocol=protocol, max_rounds=max_rounds or 8)
    return EnvRunSetup(cases, record, _open, notes)


def per_task_type(store, run_id: str) -> dict[str, dict[str, int]]:
    """Tasks and correct answers per task type, from the run's events."""
    from grandrounds.store.event_types import CaseCompleted, CaseReceived

    types: dict[str, int] = {}
    out: dict[int, dict[str, int]] = {}
    for e in store.iter(run_id, types=[CaseReceived.event_type, CaseCompleted.event_type]):
        if e.type == CaseReceived.event_type:
            types[e.case_id] = int(e.payload["case"].get("task_type", 0))
        elif e.case_id in types:
            row = out.setdefault(types[e.case_id], {"tasks": 0, "correct": 0})
            row["tasks"] += 1
            row["correct"] += bool(e.payload["correct"])
    return {str(k): v for k, v in sorted(out.items())}


def fhir_task_class(case: dict):
    """SELSM's query/action partition of a `case.received` case (for the run's task metrics)."""
    from grandrounds.handlers.environments.medagentbench import ACTION_TASK_TYPES

    if case.get("kind") != "fhir":
        return None
    return "action" if case.get("task_type") in ACTION_TASK_TYPES else "query"
