"""MedAgentBench (Stanford ML Group) FHIR tasks: the official 300 tasks, function specs and graders.

Data (../shared/data): `medagentbench/test_data_v2.json` (task1..task10 x 30), `funcs_v1.json`
(9 FHIR function specs), and the fork's `patients_from_snapshot.json` served by `fhir_sandbox`.

Grading follows the official `refsol.py` (read at rushilcs/MedAgentBench@d1f3b86, the fork's copy of
the upstream file; the rules of task1-10 are the upstream ones, the fork only added logging):
- the agent's final answer is the text inside `FINISH(...)`: a JSON list, compared with `==` after
  `json.loads` (so `["S6534835"]`, `[77]`);
- a POST counts when it was *accepted*; tasks 3 and 8 need exactly one accepted POST with the
  payload checks below; tasks 1, 2, 4, 6, 7 fail on any POST (`check_has_post`);
- the benchmark's "now" is 2023-11-13T10:15:00+00:00 (`calculate_age` uses the date 2023-11-13).
Tasks 1, 2, 3 and 8 are gradable offline against the snapshot (task 2 reads the patient's birthDate,
as refsol does, from whatever server `fhir_base` names). Tasks 4-7, 9, 10 read lab Observations
from the server: they are ported here too but only meaningful against the real MedAgentBench FHIR
server (docker image jyxsu6/medagentbench, `--fhir-base`); against the sandbox `grade` refuses them.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

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


class NeedsFullServer(RuntimeError):
    """The task type reads server data the snapshot does not hold: grade it with `--fhir-base`."""


# -- tasks -----------------------------------------------------------------------------------

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


# -- tools (funcs_v1.json) -------------------------------------------------------------------

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


@dataclass(frozen=True)
class FhirCall:
    method: str
    url: str
    payload: dict | None = None
    accepted: bool = True
    """POST: the benchmark's "POST request accepted"; GET: the request succeeded."""


@dataclass
class FhirTrajectory:
    calls: list[FhirCall] = field(default_factory=list)
    result: str | None = None
    """The text inside FINISH(...), e.g. '["S6534835"]'; None when the agent never finished."""


def http_get_json(url: str, timeout: float = 15.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (local/explicit FHIR base)
            return r.status, r.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


class FhirTools:
    """Executes the agent's FHIR calls against `base` and records them in `trajectory`.

    GET goes to the server (with `_format=json`, as the benchmark adds). POST is validated as the
    benchmark does (a JSON object) and accepted without touching a real server; with
    `send_posts=True` (the sandbox) it is also sent and accepted only on 201.
    """

    def __init__(self, functions: list[FhirFunction], base: str, send_posts: bool = False,
                 public_base: str | None = None):
        self.functions = {f.name: f for f in functions}
        self.base = base if base.endswith("/") else base + "/"
        self.public_base = (public_base or self.base).rstrip("/") + "/"
        """The base the agent is shown and writes URLs with (`get_url`/`post_url`). The sandbox listens on
        a free port; showing the agent a fixed base instead keeps its prompts (and so the request hashes a
        recorded run is re-served by) the same from one run to the next."""
        self.send_posts = send_posts
        self.trajectory = FhirTrajectory()

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        fn = self.functions.get(name)
        if fn is None:
            raise KeyError(f"unknown FHIR tool {name!r}")
        url = self.base + fn.resource
        if fn.method == "GET":
            query = urllib.parse.urlencode({**{k: str(v) for k, v in arguments.items()}, "_format": "json"})
            full = f"{url}?{query}"
            try:
                status, text = http_get_json(full)
            except (urllib.error.URLError, OSError) as exc:
                self.trajectory.calls.append(FhirCall("GET", full, accepted=False))
                return f"Error in sending the GET request: {exc}"
            self.trajectory.calls.append(FhirCall("GET", full, accepted=status == 200))
            if self.public_base != self.base:
                text = text.replace(self.base, self.public_base)  # as `get_url`: the agent sees the public base
            if status != 200:
                return f"Error in sending the GET request: HTTP {status}: {text[:500]}"
            return (f"Here is the response from the GET request:\n{text}. Please call FINISH if you have got "
                    "answers for all the questions and finished all the requested tasks")
        if not isinstance(arguments, dict) or not arguments:
            self.trajectory.calls.append(FhirCall("POST", url, None, accepted=False))
            return "Invalid POST request"
        accepted = True
        if self.send_posts:
            req = urllib.request.Request(url, data=json.dumps(arguments).encode(), method="POST",
                                         headers={"Content-Type": "application/fhir+json"})
            try:
                with urllib.request.urlopen(req, timeout=15) as r:  # noqa: S310
                    accepted = r.status == 201
            except (urllib.error.URLError, OSError):
                accepted = False
        self.trajectory.calls.append(FhirCall("POST", url, dict(arguments), accepted=accepted))
        if not accepted:
            return "Invalid POST request"
        return ("POST request accepted and executed successfully. Please call FINISH if you have got answers "
                "for all the questions and finished all the requested tasks")

    def finish(self, result: str) -> None:
        self.trajectory.result = result

    # The official text protocol names full URLs ("GET {api_base}Patient?..." / "POST {api_base}Observation").
    # Only URLs under `base` are served: a model's output must not make the harness fetch anything else.

    def _under_base(self, url: str) -> bool:
        return url.startswith(self.public_base) and ".." not in url[len(self.public_base):]

    def _real(self, url: str) -> str:
        return self.base + url[len(self.public_base):]

    def get_url(self, url: str) -> str:
        """The benchmark's GET: the URL as the agent wrote it, plus `_format=json`."""
        url = url.strip()
        if not self._under_base(url):
            self.trajectory.calls.append(FhirCall("GET", url, accepted=False))
            return f"Error in sending the GET request: only URLs under {self.public_base} are served"
        url = self._real(url)
        full = url + ("&" if "?" in url else "?") + "_format=json"
        try:
            status, text = http_get_json(full)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.trajectory.calls.append(FhirCall("GET", full, accepted=False))
            return f"Error in sending the GET request: {exc}"
        self.trajectory.calls.append(FhirCall("GET", full, accepted=status == 200))
        if self.public_base != self.base:
            text = text.replace(self.base, self.public_base)  # fullUrls name the server's real address
        if status != 200:
            return f"Error in sending the GET request: HTTP {status}: {text[:500]}"
        return (f"Here is the response from the GET request:\n{text}. Please call FINISH if you have got "
                "answers for all the questions and finished all the requested tasks")

    def post_url(self, url: str, payload: Any) -> str:
        """The benchmark's POST: any JSON object under the base is accepted (and sent to the sandbox with
        `send_posts`); grading compares its URL with `{base}<Resource>`."""
        url = url.strip()
        if not isinstance(payload, dict) or not self._under_base(url):
            self.trajectory.calls.append(FhirCall("POST", url, None, accepted=False))
            return "Invalid POST request"
        url = self._real(url)  # recorded at the real base, which is what grading compares with
        accepted = True
        if self.send_posts:
            req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/fhir+json"})
            try:
                with urllib.request.urlopen(req, timeout=15) as r:  # noqa: S310 (under base only)
                    accepted = r.status == 201
            except (urllib.error.URLError, OSError, ValueError):
                accepted = False
        self.trajectory.calls.append(FhirCall("POST", url, dict(payload), accepted=accepted))
        if not accepted:
            return "Invalid POST request"
        return ("POST request accepted and executed successfully. Please call FINISH if you have got answers "
                "for all the questions and finished all the requested tasks")


# -- grading (refsol.py) ---------------------------------------------------------------------

@dataclass(frozen=True)
class Grade:
    correct: bool
    reason: str
    reference: Any = None


def _posts(t: FhirTrajectory) -> list[tuple[str, dict]]:
    return [(c.url, c.payload) for c in t.calls if c.method == "POST" and c.accepted and c.payload is not None]


def _has_post(t: FhirTrajectory) -> bool:
    return any(c.method == "POST" for c in t.calls)


def _result_equals(t: FhirTrajectory, ref: list, allow_empty: bool = False) -> Grade:
    try:
        got = json.loads(t.result) if t.result is not None else None
    except json.JSONDecodeError:
        return Grade(False, f"answer {t.result!r} is not JSON", ref)
    if got == ref or (allow_empty and got == []):
        return Grade(True, "answer matches", ref)
    return Grade(False, f"answer {t.result!r} != reference {json.dumps(ref)}", ref)


def calculate_age(dob: datetime) -> int:
    today = datetime(2023, 11, 13)
    age = today.year - dob.year
    if (today.month, today.day) < (dob.month, dob.day):
        age -= 1
    return age


def _bundle(fetch: Callable[[str], dict], url: str) -> list[dict]:
    return [e["resource"] for e in fetch(url).get("entry", [])]


def _subject_ok(payload: dict, case: FhirCase) -> bool:
    return payload.get("subject") == {"reference": f"Patient/{case.eval_mrn}"}


def _check(payload: dict, checks: list[tuple[str, Callable[[dict], bool]]]) -> str | None:
    for label, ok in checks:
        try:
            if not ok(payload):
                return label
        except (KeyError, IndexError, TypeError, AttributeError):
            return label
    return None


def _one_post(t: FhirTrajectory, url: str) -> tuple[dict | None, str | None]:
    posts = _posts(t)
    if len(posts) != 1:
        return None, f"{len(posts)} accepted POSTs, expected exactly 1"
    if posts[0][0] != url:
        return None, f"POST to {posts[0][0]}, expected {url}"
    return posts[0][1], None


def _task3(case: FhirCase, t: FhirTrajectory, base: str, fetch) -> Grade:
    payload, err = _one_post(t, f"{base}Observation")
    if err:
        return Grade(False, err)
    bad = _check(payload, [
        ("resourceType", lambda p: p["resourceType"] == "Observation"),
        ("category", lambda p: len(p["category"]) == 1 and len(p["category"][0]["coding"]) == 1
         and p["category"][0]["coding"][0] == {"system": "http://hl7.org/fhir/observation-category",
                                               "code": "vital-signs", "display": "Vital Signs"}),
        ("code", lambda p: p["code"] == {"text": "BP"}),
        ("effectiveDateTime", lambda p: p["effectiveDateTime"] == NOW),
        ("status", lambda p: p["status"] == "final"),
        ("valueString", lambda p: p["valueString"] == "118/77 mmHg"),
        ("subject", lambda p: _subject_ok(p, case)),
    ])
    return Grade(bad is None, "payload matches" if bad is None else f"payload field {bad} is wrong")


def _task8(case: FhirCase, t: FhirTrajectory, base: str, fetch) -> Grade:
    payload, err = _one_post(t, f"{base}ServiceRequest")
    if err:
        return Grade(False, err)
    bad = _check(payload, [
        ("resourceType", lambda p: p["resourceType"] == "ServiceRequest"),
        ("code.system", lambda p: p["code"]["coding"][0]["system"] == "http://snomed.info/sct"),
        ("code.code", lambda p: p["code"]["coding"][0]["code"] == "306181000000106"),
        ("authoredOn", lambda p: p["authoredOn"] == NOW),
        ("status", lambda p: p["status"] == "active"),
        ("intent", lambda p: p["intent"] == "order"),
        ("priority", lambda p: p["priority"] == "stat"),
        ("note.text", lambda p: TASK8_COMMENT in p["note"]["text"]),
        ("subject", lambda p: _subject_ok(p, case)),
    ])
    return Grade(bad is None, "payload matches" if bad is None else f"payload field {bad} is wrong")


def _task1(case: FhirCase, t: FhirTrajectory, base: str, fetch) -> Grade:
    if _has_post(t):
        return Grade(False, "task 1 must not POST")
    return _result_equals(t, list(case.sol or []))


def _task2(case: FhirCase, t: FhirTrajectory, base: str, fetch) -> Grade:
    if _has_post(t):
        return Grade(False, "task 2 must not POST")
    patients = _bundle(fetch, f"{base}Patient?identifier={case.eval_mrn}&_format=json")
    dob = datetime.strptime(patients[0]["birthDate"], "%Y-%m-%d")
    return _result_equals(t, [calculate_age(dob)])


def _observations(fetch, base: str, mrn: str, code: str) -> list[tuple[datetime, str, Any]]:
    url = f"{base}Observation?patient={mrn}&code={code}&_count=5000&_format=json"
    return [(datetime.fromisoformat(r["effectiveDateTime"]), r["effectiveDateTime"], r["valueQuantity"]["value"])
            for r in _bundle(fetch, url)]


def _latest(obs, since: datetime | None = None):
    best = None
    for when, raw, value in obs:
        if since is not None and when < since:
            continue
        if best is None or when > best[0]:
            best = (when, raw, value)
    return best


_CUTOFF = datetime.fromisoformat(NOW)


def _task4(case, t, base, fetch) -> Grade:
    if _has_post(t):
        return Grade(False, "task 4 must not POST")
    last = _latest(_observations(fetch, base, case.eval_mrn, "MG"), _CUTOFF - timedelta(hours=24))
    return _result_equals(t, [last[2] if last else -1])


def _med_checks(case, ndc: str) -> list:
    return [("resourceType", lambda p: p["resourceType"] == "MedicationRequest"),
            ("medication.system", lambda p: p["medicationCodeableConcept"]["coding"][0]["system"]
             == "http://hl7.org/fhir/sid/ndc"),
            ("medication.code", lambda p: p["medicationCodeableConcept"]["coding"][0]["code"] == ndc),
            ("authoredOn", lambda p: "2023-11-13T10:15" in p["authoredOn"]),
            ("status", lambda p: p["status"] == "active"), ("intent", lambda p: p["intent"] == "order"),
            ("subject", lambda p: _subject_ok(p, case))]


def _task5(case, t, base, fetch) -> Grade:
    last = _latest(_observations(fetch, base, case.eval_mrn, "MG"), _CUTOFF - timedelta(hours=24))
    value = last[2] if last else None
    if value is None:
        return Grade(not _has_post(t), "no Mg in 24 h: nothing may be ordered")
    if value > 1.9:
        if _has_post(t):
            return Grade(False, "Mg not low: nothing may be ordered")
    else:
        payload, err = _one_post(t, f"{base}MedicationRequest")
        if err:
            return Grade(False, err)
        dose = 4 if value < 1 else 2 if value < 1.5 else 1
        bad = _check(payload, _med_checks(case, "0338-1715-40") + [
            ("route", lambda p: p["dosageInstruction"][0]["route"] == "IV"),
            ("doseQuantity", lambda p: p["dosageInstruction"][0]["doseAndRate"][0]["doseQuantity"]
             == {"value": dose, "unit": "g"}),
            ("rateQuantity", lambda p: p["dosageInstruction"][0]["doseAndRate"][0]["rateQuantity"]
             == {"value": dose, "unit": "h"})])
        if bad:
            return Grade(False, f"payload field {bad} is wrong")
    return _result_equals(t, [value], allow_empty=True)


def _task6(case, t, base, fetch) -> Grade:
    if _has_post(t):
        return Grade(False, "task 6 must not POST")
    vals = [v for when, _, v in _observations(fetch, base, case.eval_mrn, "GLU")
            if when >= _CUTOFF - timedelta(hours=24)]
    ref = [sum(vals) / len(vals) if vals else -1]
    try:
        got = json.loads(t.result) if t.result is not None else None
        ok = isinstance(got, list) and len(got) == 1 and abs(got[0] - ref[0]) < 0.1
    except (json.JSONDecodeError, TypeError):
        ok = False
    return Grade(ok, "answer within 0.1" if ok else f"answer {t.result!r} vs reference {ref}", ref)


def _task7(case, t, base, fetch) -> Grade:
    if _has_post(t):
        return Grade(False, "task 7 must not POST")
    last = _latest(_observations(fetch, base, case.eval_mrn, "GLU"))
    return _result_equals(t, [last[2] if last else -1])


def _task9(case, t, base, fetch) -> Grade:
    last = _latest(_observations(fetch, base, case.eval_mrn, "K"))
    value = last[2] if last else None
    if value is None or value >= 3.5:
        if _has_post(t):
            return Grade(False, "K not low or unavailable: nothing may be ordered")
    else:
        posts = _posts(t)
        if len(posts) != 2:
            return Grade(False, f"{len(posts)} accepted POSTs, expected 2")
        if posts[0][0] != f"{base}MedicationRequest" or posts[1][0] != f"{base}ServiceRequest":
            return Grade(False, "expected MedicationRequest then ServiceRequest")
        dose = (3.5 - value) / 0.1 * 10
        bad = _check(posts[0][1], _med_checks(case, "40032-917-01") + [
            ("route", lambda p: p["dosageInstruction"][0]["route"].lower().strip() == "oral"),
            ("dose", lambda p: abs(p["dosageInstruction"][0]["doseAndRate"][0]["doseQuantity"]["value"] - dose) <= 0.1),
            ("unit", lambda p: p["dosageInstruction"][0]["doseAndRate"][0]["doseQuantity"]["unit"] == "mEq")])
        bad = bad or _check(posts[1][1], _service_checks(case, "http://loinc.org", "2823-3") + [
            ("occurrenceDateTime", lambda p: "2023-11-14T08:" in p["occurrenceDateTime"])])
        if bad:
            return Grade(False, f"payload field {bad} is wrong")
    return _result_equals(t, [value if value is not None else -1], allow_empty=True)


def _service_checks(case, system: str, code: str) -> list:
    return [("resourceType", lambda p: p["resourceType"] == "ServiceRequest"),
            ("code.system", lambda p: p["code"]["coding"][0]["system"] == system),
            ("code.code", lambda p: p["code"]["coding"][0]["code"] == code),
            ("authoredOn", lambda p: p["authoredOn"] == NOW), ("status", lambda p: p["status"] == "active"),
            ("intent", lambda p: p["intent"] == "order"), ("priority", lambda p: p["priority"] == "stat"),
            ("subject", lambda p: _subject_ok(p, case))]


def _task10(case, t, base, fetch) -> Grade:
    last = _latest(_observations(fetch, base, case.eval_mrn, "A1C"))
    ref = [-1] if last is None else [last[2], last[1]]
    if last is None or last[0] < datetime.fromisoformat("2022-11-13T10:15:00+00:00"):
        payload, err = _one_post(t, f"{base}ServiceRequest")
        if err:
            return Grade(False, err)
        bad = _check(payload, _service_checks(case, "http://loinc.org", "4548-4"))
        if bad:
            return Grade(False, f"payload field {bad} is wrong")
    elif _has_post(t):
        return Grade(False, "recent A1C: nothing may be ordered")
    return _result_equals(t, ref, allow_empty=True)


GRADERS = {1: _task1, 2: _task2, 3: _task3, 4: _task4, 5: _task5, 6: _task6, 7: _task7, 8: _task8,
           9: _task9, 10: _task10}


def default_fetch(url: str) -> dict:
    status, text = http_get_json(url)
    if status != 200:
        raise RuntimeError(f"GET {url}: HTTP {status}")
    return json.loads(text)


def grade(case: FhirCase, trajectory: FhirTrajectory, fhir_base: str, full_server: bool = False,
          fetch: Callable[[str], dict] = default_fetch) -> Grade:
    """Official refsol rules. `full_server`: `fhir_base` is the real MedAgentBench server (`--fhir-base`);
    without it only task types 1, 2, 3 and 8 are graded (the others raise `NeedsFullServer`)."""
    if not isinstance(case, FhirCase) or case.task_type not in GRADERS:
        raise ValueError(f"{case.case_id}: not a MedAgentBench task")
    if needs_full_server(case) and not full_server:
        raise NeedsFullServer(f"{case.case_id}: task type {case.task_type} reads lab data the snapshot lacks; "
                              "grade it against the real FHIR server (--fhir-base)")
    base = fhir_base if fhir_base.endswith("/") else fhir_base + "/"
    return GRADERS[case.task_type](case, trajectory, base, fetch)


# -- what the grader expects, in words (shown to reflection, after feedback) ------------------

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


# -- the agent's final answer ----------------------------------------------------------------

_FINISH = re.compile(r"FINISH\((.*)\)\s*$", re.DOTALL)


def finish_payload(text: str) -> str:
    """The benchmark's answer is `FINISH([...])`; accept that or a bare JSON list."""
    m = _FINISH.search(text.strip())
    return (m.group(1) if m else text).strip()
