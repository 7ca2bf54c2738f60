"""Grading by the official reference solutions (`refsol.py`, read at rushilcs/MedAgentBench@d1f3b86,
the fork's copy of the upstream file; MIT, Stanford ML Group) and the harness's `calculate_overall`.

Read as the official code reads a finished episode:
- a task is graded only when the episode has a result (`FINISH(...)`); an invalid action or the
  turn limit leaves none, and the task counts as incorrect without its grader running;
- `check_has_post`: any agent reply containing the text `POST` (anywhere, even a refused one);
- `extract_posts`: agent replies containing `POST` whose next message is the harness's "POST request
  accepted"; the URL is the reply's first line after 4 characters, the payload its other lines
  (`json.loads`); a reply that does not parse that way is skipped. A final reply containing `POST`
  (the FINISH itself) has no next message: refsol raises there, and the task is incorrect;
- any exception inside a grader makes the task incorrect (`eval` catches it);
- the reference data (the patient's birth date, lab Observations) is read from the server by GET,
  as refsol does: `reference` fetches it (async), `grade` is then a pure function.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

from grandrounds.handlers.cases import FhirCase
from grandrounds.handlers.environments.medagentbench.tasks import NOW, TASK8_COMMENT, NeedsFullServer, needs_full_server
from grandrounds.handlers.environments.medagentbench.trajectory import FhirTrajectory, Message

_CUTOFF = datetime.fromisoformat(NOW)
LAB_CODE = {4: "MG", 5: "MG", 6: "GLU", 7: "GLU", 9: "K", 10: "A1C"}


@dataclass(frozen=True)
class Grade:
    correct: bool
    reason: str
    reference: Any = None
    graded: bool = True
    """False when the episode left no result: officially such a task is not graded (and not correct)."""
    min_rounds: int = 2
    """The fewest agent replies that solve this task by the reference solution's branch: its GETs and
    required POSTs, then FINISH (OSR's T_min)."""


class _Fail(Exception):
    """A refsol `return False` with the reason it was returned."""


def reference_url(case: FhirCase, base: str) -> str | None:
    """What refsol GETs for this task (None: it reads nothing)."""
    if case.task_type == 2:
        return f"{base}Patient?identifier={case.eval_mrn}&_format=json"
    if case.task_type in LAB_CODE:
        return f"{base}Observation?patient={case.eval_mrn}&code={LAB_CODE[case.task_type]}&_count=5000&_format=json"
    return None


async def reference(case: FhirCase, base: str, client) -> dict | None:
    """The server data refsol reads for this task; None when it reads none. A failed read raises
    (`FhirTransportError`): refsol would fail on it too, and the caller decides."""
    url = reference_url(case, base)
    return None if url is None else await client.get_json(url)


# -- refsol's readings of the conversation ----------------------------------------------------

def check_has_post(history: list[Message]) -> bool:
    return any(m.role == "agent" and "POST" in m.content for m in history)


def extract_posts(history: list[Message]) -> list[tuple[str, Any]]:
    posts = []
    for idx, m in enumerate(history):
        if m.role == "agent" and "POST" in m.content:
            if "POST request accepted" in history[idx + 1].content:  # IndexError on a final reply: as refsol
                try:
                    lines = m.content.split("\n")
                    posts.append((lines[0][4:].strip(), json.loads("\n".join(lines[1:]))))
                except Exception:  # noqa: BLE001 - refsol skips a reply it cannot read
                    continue
    return posts


def calculate_age(dob: datetime) -> int:
    today = datetime(2023, 11, 13)
    age = today.year - dob.year
    if (today.month, today.day) < (dob.month, dob.day):
        age -= 1
    return age


def _entries(data: dict | None) -> list[dict]:
    return [e["resource"] for e in (data or {}).get("entry", [])]


def _observations(data: dict | None) -> list[tuple[datetime, str, Any]]:
    return [(datetime.fromisoformat(r["effectiveDateTime"]), r["effectiveDateTime"], r["valueQuantity"]["value"])
            for r in _entries(data)]


def _latest(obs, since: datetime | None = None):
    best = None
    for when, raw, value in obs:
        if since is not None and when < since:
            continue
        if best is None or when > best[0]:
            best = (when, raw, value)
    return best


def _answer_is(result: str, ref: list, allow_empty: bool = False) -> None:
    try:
        got = json.loads(result)
    except Exception:  # noqa: BLE001 - refsol: `except: return False`
        raise _Fail(f"answer {result!r} is not JSON") from None
    if not (got == ref or (allow_empty and got == [])):
        raise _Fail(f"answer {result!r} != reference {json.dumps(ref)}")


def _no_post(history: list[Message], why: str) -> None:
    if check_has_post(history):
        raise _Fail(why)


def _one_post(history: list[Message], url: str) -> dict:
    posts = extract_posts(history)
    if len(posts) != 1:
        raise _Fail(f"{len(posts)} accepted POSTs, expected exactly 1")
    if posts[0][0] != url:
        raise _Fail(f"POST to {posts[0][0]}, expected {url}")
    return posts[0][1]


def _check(payload: Any, checks: list[tuple[str, Callable[[Any], bool]]]) -> None:
    for label, ok in checks:
        try:
            good = ok(payload)
        except Exception:  # noqa: BLE001 - an assert that raises is a failed assert in refsol
            good = False
        if not good:
            raise _Fail(f"payload field {label} is wrong")


def _subject(case: FhirCase) -> tuple[str, Callable[[Any], bool]]:
    return "subject", lambda p: p["subject"] == {"reference": f"Patient/{case.eval_mrn}"}


def _med_checks(case: FhirCase, ndc: str) -> list:
    return [("resourceType", lambda p: p["resourceType"] == "MedicationRequest"),
            ("medication.system", lambda p: p["medicationCodeableConcept"]["coding"][0]["system"]
             == "http://hl7.org/fhir/sid/ndc"),
            ("medication.code", lambda p: p["medicationCodeableConcept"]["coding"][0]["code"] == ndc),
            ("authoredOn", lambda p: "2023-11-13T10:15" in p["authoredOn"])]


def _service_checks(case: FhirCase, system: str, code: str) -> list:
    return [("resourceType", lambda p: p["resourceType"] == "ServiceRequest"),
            ("code.system", lambda p: p["code"]["coding"][0]["system"] == system),
            ("code.code", lambda p: p["code"]["coding"][0]["code"] == code),
            ("authoredOn", lambda p: p["authoredOn"] == NOW), ("status", lambda p: p["status"] == "active"),
            ("intent", lambda p: p["intent"] == "order"), ("priority", lambda p: p["priority"] == "stat"),
            _subject(case)]


# -- the ten graders (refsol task1..task10) ----------------------------------------------------

def _task1(case, h, result, base, data):
    _no_post(h, "task 1 must not POST")
    _answer_is(result, list(case.sol or []))
    return list(case.sol or []), 2


def _task2(case, h, result, base, data):
    _no_post(h, "task 2 must not POST")
    ref = [calculate_age(datetime.strptime(data["entry"][0]["resource"]["birthDate"], "%Y-%m-%d"))]
    _answer_is(result, ref)
    return ref, 2


def _task3(case, h, result, base, data):
    _check(_one_post(h, f"{base}Observation"), [
        ("resourceType", lambda p: p["resourceType"] == "Observation"),
        ("category", lambda p: len(p["category"]) == 1 and len(p["category"][0]["coding"]) == 1
         and p["category"][0]["coding"][0] == {"system": "http://hl7.org/fhir/observation-category",
                                               "code": "vital-signs", "display": "Vital Signs"}),
        ("code", lambda p: p["code"] == {"text": "BP"}),
        ("effectiveDateTime", lambda p: p["effectiveDateTime"] == NOW),
        ("status", lambda p: p["status"] == "final"),
        ("valueString", lambda p: p["valueString"] == "118/77 mmHg"),
        _subject(case)])
    return None, 2


def _task4(case, h, result, base, data):
    _no_post(h, "task 4 must not POST")
    last = _latest(_observations(data), _CUTOFF - timedelta(hours=24))
    ref = [last[2] if last else -1]
    _answer_is(result, ref)
    return ref, 2


def _task5(case, h, result, base, data):
    last = _latest(_observations(data), _CUTOFF - timedelta(hours=24))
    value = last[2] if last else None
    if value is None:  # refsol: "We don't care the finish"
        _no_post(h, "no Mg in 24 h: nothing may be ordered")
        return [-1], 2
    if value > 1.9:
        _no_post(h, "Mg not low: nothing may be ordered")
        rounds = 2
    else:
        dose = 4 if value < 1 else 2 if value < 1.5 else 1
        _check(_one_post(h, f"{base}MedicationRequest"), _med_checks(case, "0338-1715-40") + [
            ("route", lambda p: p["dosageInstruction"][0]["route"] == "IV"),
            ("doseQuantity", lambda p: p["dosageInstruction"][0]["doseAndRate"][0]["doseQuantity"]
             == {"value": dose, "unit": "g"}),
            ("rateQuantity", lambda p: p["dosageInstruction"][0]["doseAndRate"][0]["rateQuantity"]
             == {"value": dose, "unit": "h"}),
            ("status", lambda p: p["status"] == "active"), ("intent", lambda p: p["intent"] == "order"),
            _subject(case)])
        rounds = 3
    _answer_is(result, [value], allow_empty=True)
    return [value], rounds


def _task6(case, h, result, base, data):
    _no_post(h, "task 6 must not POST")
    vals = [v for when, _, v in _observations(data) if when >= _CUTOFF - timedelta(hours=24)]
    ref = [sum(vals) / len(vals) if vals else -1]
    try:
        got = json.loads(result)
        ok = len(got) == 1 and abs(got[0] - ref[0]) < 0.1
    except Exception:  # noqa: BLE001 - refsol: `except: return False`
        ok = False
    if not ok:
        raise _Fail(f"answer {result!r} not within 0.1 of reference {ref}")
    return ref, 2


def _task7(case, h, result, base, data):
    _no_post(h, "task 7 must not POST")
    last = _latest(_observations(data))
    ref = [last[2] if last else -1]
    _answer_is(result, ref)
    return ref, 2


def _task8(case, h, result, base, data):
    _check(_one_post(h, f"{base}ServiceRequest"), [
        ("resourceType", lambda p: p["resourceType"] == "ServiceRequest"),
        ("code.system", lambda p: p["code"]["coding"][0]["system"] == "http://snomed.info/sct"),
        ("code.code", lambda p: p["code"]["coding"][0]["code"] == "306181000000106"),
        ("authoredOn", lambda p: p["authoredOn"] == NOW),
        ("status", lambda p: p["status"] == "active"),
        ("intent", lambda p: p["intent"] == "order"),
        ("priority", lambda p: p["priority"] == "stat"),
        ("note.text", lambda p: TASK8_COMMENT in p["note"]["text"]),
        _subject(case)])
    return None, 2


def _task9(case, h, result, base, data):
    last = _latest(_observations(data))
    value = last[2] if last else None
    if value is None or value >= 3.5:
        _no_post(h, "K not low or unavailable: nothing may be ordered")
        rounds = 2
    else:
        posts = extract_posts(h)
        if len(posts) != 2:
            raise _Fail(f"{len(posts)} accepted POSTs, expected 2")
        if posts[0][0] != f"{base}MedicationRequest":
            raise _Fail(f"first POST to {posts[0][0]}, expected {base}MedicationRequest")
        dose = (3.5 - value) / 0.1 * 10
        _check(posts[0][1], _med_checks(case, "40032-917-01") + [
            ("route", lambda p: p["dosageInstruction"][0]["route"].lower().strip() == "oral"),
            ("dose", lambda p: abs(p["dosageInstruction"][0]["doseAndRate"][0]["doseQuantity"]["value"] - dose) <= 0.1),
            ("unit", lambda p: p["dosageInstruction"][0]["doseAndRate"][0]["doseQuantity"]["unit"] == "mEq"),
            ("status", lambda p: p["status"] == "active"), ("intent", lambda p: p["intent"] == "order"),
            _subject(case)])
        if posts[1][0] != f"{base}ServiceRequest":
            raise _Fail(f"second POST to {posts[1][0]}, expected {base}ServiceRequest")
        _check(posts[1][1], _service_checks(case, "http://loinc.org", "2823-3") + [
            ("occurrenceDateTime", lambda p: "2023-11-14T08:" in p["occurrenceDateTime"])])
        rounds = 4
    ref = [value if value is not None else -1]
    _answer_is(result, ref, allow_empty=True)
    return ref, rounds


def _task10(case, h, result, base, data):
    last = _latest(_observations(data))
    ref = [-1] if last is None else [last[2], last[1]]
    if last is None or last[0] < datetime.fromisoformat("2022-11-13T10:15:00+00:00"):
        _check(_one_post(h, f"{base}ServiceRequest"), _service_checks(case, "http://loinc.org", "4548-4"))
        rounds = 3
    else:
        _no_post(h, "recent A1C: nothing may be ordered")
        rounds = 2
    _answer_is(result, ref, allow_empty=True)
    return ref, rounds


GRADERS = {1: _task1, 2: _task2, 3: _task3, 4: _task4, 5: _task5, 6: _task6, 7: _task7, 8: _task8,
           9: _task9, 10: _task10}


def grade(case: FhirCase, trajectory: FhirTrajectory, fhir_base: str, data: dict | None = None,
          full_server: bool = False) -> Grade:
    """Official rules. `fhir_base`: the api_base the agent was shown (POST URLs are compared with it);
    `data`: what `reference` read for this task. Without `full_server` only task types 1, 2, 3 and 8
    are graded (the others raise `NeedsFullServer`)."""
    if not isinstance(case, FhirCase) or case.task_type not in GRADERS:
        raise ValueError(f"{case.case_id}: not a MedAgentBench task")
    if needs_full_server(case) and not full_server:
        raise NeedsFullServer(f"{case.case_id}: task type {case.task_type} reads lab data the snapshot lacks; "
                              "grade it against the real FHIR server (--fhir-base)")
    base = fhir_base if fhir_base.endswith("/") else fhir_base + "/"
    if trajectory.result is None:  # calculate_overall: `if result is not None` around eval
        return Grade(False, "no FINISH result: not graded (officially incorrect)", graded=False)
    try:
        ref, rounds = GRADERS[case.task_type](case, trajectory.official_history(), trajectory.result, base, data)
    except _Fail as exc:
        return Grade(False, str(exc), min_rounds=_branch_rounds(case, data))
    except Exception as exc:  # noqa: BLE001 - as the official eval step: any grader exception is incorrect
        return Grade(False, f"refsol raised {type(exc).__name__}: {exc}", min_rounds=_branch_rounds(case, data))
    return Grade(True, "payload matches" if case.task_type in (3, 8) else "answer matches", ref, min_rounds=rounds)


def _branch_rounds(case: FhirCase, data: dict | None) -> int:
    """T_min of the reference solution's branch, for a task graded incorrect."""
    try:
        if case.task_type == 5:
            last = _latest(_observations(data), _CUTOFF - timedelta(hours=24))
            return 3 if last and last[2] <= 1.9 else 2
        if case.task_type == 9:
            last = _latest(_observations(data))
            return 4 if last and last[2] < 3.5 else 2
        if case.task_type == 10:
            last = _latest(_observations(data))
            return 3 if last is None or last[0] < datetime.fromisoformat("2022-11-13T10:15:00+00:00") else 2
    except Exception:  # noqa: BLE001 - unreadable data: the shortest episode
        return 2
    return 2
