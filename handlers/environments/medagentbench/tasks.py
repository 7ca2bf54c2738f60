"""MedAgentBench (Stanford ML Group) tasks and function specs, as the official files define them.

Data (../shared/data): `medagentbench/test_data_v2.json` (task1..task10 x 30) and `funcs_v1.json`
(9 FHIR function specs). The benchmark's "now" is 2023-11-13T10:15:00+00:00.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import json
import re
from dataclasses import dataclass
from pathlib import Path

from grandrounds.handlers.cases import FhirCase

NOW = "2023-11-13T10:15:00+00:00"
OFFLINE_TASK_TYPES = (1, 2, 3, 8)
FULL_SERVER_TASK_TYPES = (4, 5, 6, 7, 9, 10)
ACTION_TASK_TYPES = (3, 5, 8, 9, 10)
"""SELSM's action tasks (may change server state by POST); the others are query tasks."""
TASK8_COMMENT = ("Situation: acute left knee injury, Background: radiology report indicates ACL tear. "
                 "Assessment: ACL tear grade II. Recommendation: request for Orthopedic service to evaluate "
                 "and provide management recommendations.")
_ID = re.compile(r"^task(\d+)_(\d+)$")


class NeedsFullServer(InvalidInput, RuntimeError):
    """The task type reads server data the snapshot does not hold: grade it with `--fhir-base`."""


def task_case(item: dict) -> FhirCase:
    m = _ID.match(item["id"])
    if m is None:
        raise ValueError(f"unexpected MedAgentBench id {item['id']!r}")
    task_type = int(m.group(1))
    return FhirCase(case_id=f"mab-{item['id']}", instruction=item["instruction"].strip(),
                    context=item.get("context", ""), eval_mrn=item.get("eval_MRN"), sol=item.get("sol"),
                    task_type=task_type, category=f"medagentbench-task{task_type}")


def load_tasks(path: str | Path, task_types: tuple[int, ...] | None = None, limit: int | None = None) -> list[FhirCase]:
    items = json.loads(Path(path).read_text(encoding="utf-8"))
    cases = [task_case(it) for it in items]
    if task_types:
        cases = [c for c in cases if c.task_type in task_types]
    return cases[:limit]


def needs_full_server(case: FhirCase) -> bool:
    return case.task_type not in OFFLINE_TASK_TYPES


@dataclass(frozen=True)
class FhirFunction:
    name: str
    """Tool name for the agent protocol, e.g. `get_patient`, `get_observation_labs`, `post_observation`."""
    method: str
    resource: str
    description: str
    parameters: dict


def _tool_name(method: str, resource: str, description: str) -> str:
    m = re.match(r"\S+\s*\(([^)]+)\)", description)  # "Observation.Search (Labs) ..." -> labs
    suffix = f"_{m.group(1).split()[0].lower()}" if m and resource == "Observation" and method == "GET" else ""
    return f"{method.lower()}_{resource.lower()}{suffix}"


def load_functions(path: str | Path) -> list[FhirFunction]:
    out = []
    for spec in json.loads(Path(path).read_text(encoding="utf-8")):
        method, _, url = spec["name"].partition(" ")
        resource = url.rsplit("/", 1)[-1]
        out.append(FhirFunction(_tool_name(method, resource, spec["description"]), method, resource,
                                spec["description"], spec["parameters"]))
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: tool names collide: {names}")
    return out


REFERENCE_PATTERNS = {
    1: 'GET Patient searching by the given name, family name and birthdate, then FINISH(["<MRN>"]) with the '
       'matching patient\'s identifier, or FINISH(["Patient not found"]); no POST',
    2: "GET Patient?identifier=<MRN>, compute the age from birthDate as of 2023-11-13 (rounded down), then "
       "FINISH([<age>]); no POST",
    3: "POST exactly one Observation (category vital-signs, code {\"text\": \"BP\"}, effectiveDateTime "
       f"{NOW}, status final, valueString the reading as given, subject Patient/<MRN>), then FINISH([])",
    4: "GET Observation?patient=<MRN>&code=MG, take the latest value of the last 24 hours, FINISH([value]) or "
       "FINISH([-1]) when there is none; no POST",
    5: "GET Observation code MG; when the latest value of the last 24 hours is 1.9 mg/dL or lower, POST one "
       "MedicationRequest (NDC 0338-1715-40, route IV, 1/2/4 g over 1/2/4 h by severity); FINISH([value]); "
       "order nothing when there is no value",
    6: "GET Observation code GLU, average the values of the last 24 hours, FINISH([average]) or FINISH([-1]); "
       "no POST",
    7: "GET Observation code GLU, FINISH([latest value]) or FINISH([-1]) when there is none; no POST",
    8: "POST exactly one ServiceRequest (SNOMED 306181000000106, authoredOn now, status active, intent order, "
       "priority stat, note.text with the SBAR text given, subject Patient/<MRN>), then FINISH([])",
    9: "GET Observation code K; when the latest value is below 3.5, POST a MedicationRequest (NDC 40032-917-01, "
       "oral, 10 mEq per 0.1 below 3.5) then a ServiceRequest (LOINC 2823-3, next day 08:00); FINISH([value])",
    10: "GET Observation code A1C; FINISH([value, date]) of the latest, or FINISH([-1]); when it is missing or "
        "older than a year, POST one ServiceRequest (LOINC 4548-4)",
}
"""The refsol rules of each task type as an action pattern: what reflection (gold visible) learns from."""

_QUOTED = re.compile(r'"[^"]*"|“[^”]*”')
_MID_SENTENCE_NAME = re.compile(r"(?<=[a-z] )[A-Z][a-z]+\b")


def template_terms(instruction: str, limit: int = 8) -> list[str]:
    """The key terms of a task's template, without its instance: quoted values, proper names in mid
    sentence and tokens with digits (MRNs, dates) are dropped, so tasks of one template share them."""
    from grandrounds.handlers.text import STOPWORDS, tokens

    out: list[str] = []
    for t in tokens(_MID_SENTENCE_NAME.sub(" ", _QUOTED.sub(" ", instruction))):
        # `key_terms` rules, but three letters are enough here: MRN, DOB, CBG name the task
        if t in STOPWORDS or len(t) < 3 or any(ch.isdigit() for ch in t) or t in out:
            continue
        out.append(t)
    return out[:limit]
