"""MedAgentBench: official tasks and functions, the local FHIR sandbox, refsol grading of types 1, 2, 3, 8."""

from __future__ import annotations

import json
import re
import urllib.request
from collections import Counter
from datetime import datetime

import pytest

from grandrounds.handlers.cases import Case, FhirCase
from grandrounds.sandbox.fhir_server import FhirSandbox
from grandrounds.handlers.environments.medagentbench import (
    NOW, OFFLINE_TASK_TYPES, TASK8_COMMENT, FhirCall, FhirTools, FhirTrajectory, NeedsFullServer, calculate_age,
    finish_payload, load_functions, load_tasks)

from fhir_helpers import grade_now as grade
from conftest import MAB_FUNCS as FUNCS, MAB_PATIENTS as PATIENTS, MAB_TASKS as TASKS, needs_medagentbench

needs_data = needs_medagentbench


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(TASKS)


@pytest.fixture(scope="module")
def functions():
    return load_functions(FUNCS)


@pytest.fixture(scope="module")
def sandbox():
    with FhirSandbox.from_file(PATIENTS) as s:
        yield s


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        return json.loads(r.read())


# -- cases --------------------------------------------------------------------------------------

def test_fhir_case_validation_and_view_hides_gold():
    f = FhirCase(case_id="t", instruction="q", context="c", task_type=1, eval_mrn="S1", sol=["S1"])
    dumped = f.model_dump(mode="json")
    assert dumped["kind"] == "fhir" and dumped["sol"] == ["S1"] and FhirCase.model_validate(dumped) == f
    view = f.view().model_dump(mode="json")
    assert "sol" not in view and "eval_mrn" not in view and view["task_type"] == 1
    with pytest.raises(ValueError):
        FhirCase(case_id="t", instruction="q", context="c", task_type=11)
    with pytest.raises(ValueError):  # `run` still takes mcq cases only
        Case.model_validate({**dumped, "question": "q"})


# -- official data --------------------------------------------------------------------------------

@needs_data
def test_official_tasks_load(tasks):
    assert len(tasks) == 300
    assert Counter(c.task_type for c in tasks) == {k: 30 for k in range(1, 11)}
    assert all(c.kind == "fhir" and c.context is not None for c in tasks)
    assert sum(c.sol is not None for c in tasks) == 30 and sum(c.eval_mrn is None for c in tasks) == 2
    assert len(load_tasks(TASKS, task_types=OFFLINE_TASK_TYPES)) == 120


@needs_data
def test_functions_become_nine_distinct_tools(functions):
    assert [f.name for f in functions] == [
        "get_condition", "get_observation_labs", "get_observation_vitals", "post_observation",
        "get_medicationrequest", "post_medicationrequest", "get_procedure", "post_servicerequest", "get_patient"]
    assert all(f.parameters["type"] == "object" for f in functions)


# -- sandbox ------------------------------------------------------------------------------------

@needs_data
def test_sandbox_answers_patient_searches_as_bundles(sandbox):
    b = get(f"{sandbox.base}Patient?identifier=S6534835&_format=json")
    assert b["resourceType"] == "Bundle" and b["total"] == 1
    p = b["entry"][0]["resource"]
    assert p["id"] == "S6534835" and p["birthDate"] == "1932-12-29"
    assert get(f"{sandbox.base}Patient?name=Peter&name=Stafford&birthdate=1932-12-29")["total"] == 1
    assert get(f"{sandbox.base}Patient?given=peter&family=stafford&birthdate=1932-12-29")["total"] == 1
    assert get(f"{sandbox.base}Patient?identifier=S0000000")["total"] == 0
    empty = get(f"{sandbox.base}Observation?patient=S6534835&code=MG&_count=5000")
    assert empty["total"] == 0 and "entry" not in empty and "lastUpdated" in empty["meta"]  # HAPI's shape
    req = urllib.request.Request(f"{sandbox.base}ServiceRequest", data=b'{"resourceType": "ServiceRequest"}',
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 201
    assert sandbox.posts[-1] == ("ServiceRequest", {"resourceType": "ServiceRequest"})


@needs_data
def test_every_official_task1_resolves_through_the_sandbox(tasks, sandbox):
    name_dob = re.compile(r"name (.+?) and DOB of (\d{4}-\d{2}-\d{2})")
    for case in (c for c in tasks if c.task_type == 1):
        name, dob = name_dob.search(case.instruction).groups()
        given, _, family = name.rpartition(" ")
        found = sandbox.search_patients([("given", given), ("family", family), ("birthdate", dob)])
        got = [p["id"] for p in found] or ["Patient not found"]
        assert got == case.sol, case.case_id
    # every MRN the official tasks name is in the snapshot
    assert all(c.eval_mrn in sandbox.by_id for c in tasks if c.eval_mrn)


# -- grading ------------------------------------------------------------------------------------

def _traj(result="[]", posts=()):
    return FhirTrajectory(calls=[FhirCall("POST", u, p) for u, p in posts], result=result)


def bp_payload(mrn: str) -> dict:
    return {"resourceType": "Observation",
            "category": [{"coding": [{"system": "http://hl7.org/fhir/observation-category", "code": "vital-signs",
                                      "display": "Vital Signs"}]}],
            "code": {"text": "BP"}, "effectiveDateTime": NOW, "status": "final", "valueString": "118/77 mmHg",
            "subject": {"reference": f"Patient/{mrn}"}}


def referral_payload(mrn: str) -> dict:
    return {"resourceType": "ServiceRequest",
            "code": {"coding": [{"system": "http://snomed.info/sct", "code": "306181000000106",
                                 "display": "Orthopedic surgery referral"}]},
            "authoredOn": NOW, "status": "active", "intent": "order", "priority": "stat",
            "note": {"text": TASK8_COMMENT}, "subject": {"reference": f"Patient/{mrn}"}}


def test_calculate_age_matches_refsol():
    assert calculate_age(datetime(1932, 12, 29)) == 90
    assert calculate_age(datetime(1932, 11, 13)) == 91
    assert calculate_age(datetime(2000, 11, 14)) == 22


@needs_data
def test_grading_types_1_2_3_8_offline(tasks, sandbox):
    by_id = {c.case_id: c for c in tasks}
    base = sandbox.base
    t1, t1nf = by_id["mab-task1_1"], by_id["mab-task1_29"]
    assert grade(t1, _traj('["S6534835"]'), base).correct
    assert not grade(t1, _traj('["S0000000"]'), base).correct
    assert not grade(t1, _traj("S6534835"), base).correct  # not a JSON list
    assert not grade(t1, _traj('["S6534835"]', [(base + "Observation", {})]), base).correct  # no POST allowed
    assert grade(t1nf, _traj('["Patient not found"]'), base).correct

    t2 = by_id["mab-task2_1"]
    dob = datetime.strptime(sandbox.by_id[t2.eval_mrn]["birthDate"], "%Y-%m-%d")
    age = calculate_age(dob)
    assert grade(t2, _traj(json.dumps([age])), base).correct
    assert not grade(t2, _traj(json.dumps([age + 1])), base).correct

    t3 = by_id["mab-task3_1"]
    good = bp_payload(t3.eval_mrn)
    assert grade(t3, _traj("[]", [(base + "Observation", good)]), base).correct
    no_finish = grade(t3, _traj(None, [(base + "Observation", good)]), base)
    assert not no_finish.correct and not no_finish.graded  # officially a task without a result is not graded
    for key, value in [("valueString", "118/77"), ("code", {"text": "bp"}), ("status", "preliminary"),
                       ("effectiveDateTime", "2023-11-13T10:15:00Z"), ("subject", {"reference": "S2380121"})]:
        g = grade(t3, _traj("[]", [(base + "Observation", {**good, key: value})]), base)
        assert not g.correct and key in g.reason
    assert not grade(t3, _traj("[]", [(base + "Observation", good)] * 2), base).correct
    assert not grade(t3, _traj("[]", [(base + "ServiceRequest", good)]), base).correct
    rejected = FhirTrajectory(calls=[FhirCall("POST", base + "Observation", good, accepted=False)], result="[]")
    assert not grade(t3, rejected, base).correct

    t8 = by_id["mab-task8_1"]
    ok = referral_payload(t8.eval_mrn)
    assert grade(t8, _traj("[]", [(base + "ServiceRequest", ok)]), base).correct
    longer = {**ok, "note": {"text": "Referral. " + TASK8_COMMENT}}
    assert grade(t8, _traj("[]", [(base + "ServiceRequest", longer)]), base).correct  # `in`, as refsol
    assert not grade(t8, _traj("[]", [(base + "ServiceRequest", {**ok, "priority": "routine"})]), base).correct
    assert not grade(t8, _traj("[]", [(base + "ServiceRequest", {**ok, "note": "x"})]), base).correct


@needs_data
def test_lab_task_types_need_the_full_server(tasks, sandbox):
    t4 = next(c for c in tasks if c.task_type == 4)
    with pytest.raises(NeedsFullServer, match="--fhir-base"):
        grade(t4, _traj("[-1]"), sandbox.base)
    # against a "full server" the ported rule runs; the snapshot has no Mg values, so the answer is -1
    assert grade(t4, _traj("[-1]"), sandbox.base, full_server=True).correct


@needs_data
def test_tools_run_against_the_sandbox_and_record_the_trajectory(functions, sandbox):
    import asyncio

    tools = FhirTools(functions, sandbox.base)
    obs = asyncio.run(tools.call("get_patient", {"identifier": "S2380121"}))
    assert obs.startswith("Here is the response from the GET request:") and '"S2380121"' in obs
    assert tools.post_url(sandbox.base + "Observation", bp_payload("S2380121")).startswith("POST request accepted")
    assert tools.post_url(sandbox.base + "Observation", None, "Expecting value") == "Invalid POST request"
    tools.finish(finish_payload("FINISH([])"))
    t = tools.trajectory
    assert [c.method for c in t.calls] == ["GET", "POST", "POST"] and t.calls[0].url.endswith("_format=json")
    assert t.result == "[]"
    cases = {c.case_id: c for c in load_tasks(TASKS, task_types=(3,))}
    assert grade(cases["mab-task3_1"], t, sandbox.base).correct
