"""The sandbox answers as a HAPI FHIR JPA server does, for the searches MedAgentBench makes.

Three kinds of evidence: (0) a real HAPI FHIR 8 JPA server (`real_server`, below) asked the same
searches; (1) the fork's `fhir_snapshot.jsonl` holds 1,062 responses recorded from the
real MedAgentBench HAPI server (Patient by identifier, Observation by patient and code, the patient
list); the sandbox must give the same bundles for the same URLs, apart from the per-request id and
the time stamp; (2) HAPI's documented string, token and date search rules on the snapshot's patients.
"""

from __future__ import annotations

import json

import pytest

from conftest import MAB_PATIENTS as PATIENTS, SHARED_DATA, needs_medagentbench
from grandrounds.sandbox.fhir_search import SearchError, normalise, search
from grandrounds.sandbox.fhir_server import FhirSandbox, load_patients

SNAPSHOT = SHARED_DATA / "medagentbench_rl_fork" / "fhir_snapshot.jsonl"
pytestmark = needs_medagentbench
RECORDED_BASE = "http://localhost:8080/fhir/"


@pytest.fixture(scope="module")
def sandbox():
    return FhirSandbox(load_patients(PATIENTS), base=RECORDED_BASE)  # `handle` needs no socket


def _answer(sandbox: FhirSandbox, url: str) -> tuple[int, dict]:
    return sandbox.handle("GET", "/fhir/" + url[len(RECORDED_BASE):], None)


def _comparable(bundle: dict) -> dict:
    out = {k: v for k, v in bundle.items() if k not in ("id", "meta")}
    out["keys"] = list(bundle)  # HAPI's key order
    out["meta"] = sorted(bundle.get("meta", {}))
    return out


@pytest.mark.skipif(not SNAPSHOT.exists(), reason="fhir_snapshot.jsonl not present")
def test_bundles_match_the_recorded_hapi_responses(sandbox):
    compared = 0
    for line in SNAPSHOT.read_text().splitlines():
        rec = json.loads(line)
        url = rec["url"]
        if not url.startswith(RECORDED_BASE) or "_count=500" in url and "Patient" in url:
            continue  # the 127.0.0.1 copies; the paged patient list (HAPI pages it, the sandbox does not)
        status, got = _answer(sandbox, url)
        assert status == rec["status_code"] == 200, url
        assert _comparable(got) == _comparable(rec["data"]), url
        compared += 1
    assert compared == 530  # 106 Patient?identifier= and 424 Observation searches


def test_string_search_is_a_prefix_of_one_name_part(sandbox):
    ids = lambda **q: [p["id"] for p in search(sandbox.patients, list(q.items()))]  # noqa: E731
    assert ids(name="Peter Stafford") == [] and ids(name="Stafford Peter") == []  # HAPI: no part starts so
    assert "S6534835" in ids(name="Pet") and "S6534835" in ids(name="STAFF") and ids(name="Pet Staf") == []
    assert ids(given="Peter", family="Stafford", birthdate="1932-12-29") == ["S6534835"]
    both = [p["id"] for p in search(sandbox.patients, [("name", "peter"), ("name", "stafford")])]
    assert both == ["S6534835"]  # a repeated parameter is AND
    assert set(ids(name="peter,stafford")) >= {"S6534835"} and len(ids(name="peter,stafford")) > 1  # comma: OR
    assert ids(**{"family:exact": "stafford"}) == [] and "S6534835" in ids(**{"family:exact": "Stafford"})
    assert normalise("Ésta Zoë") == "esta zoe"


def test_date_search_has_precision_and_prefixes(sandbox):
    def n(value):
        return len(search(sandbox.patients, [("birthdate", value)]))

    year = n("1932")
    assert year >= 1 and "S6534835" in [p["id"] for p in search(sandbox.patients, [("birthdate", "1932")])]
    assert n("1932-12") <= year and n("1932-12-29") >= 1
    assert n("lt1932") + year + n("gt1932") == len(sandbox.patients)
    assert n("ge1932-01-01") == n("gt1931")
    with pytest.raises(SearchError):
        n("29-12-1932")


def test_tokens_and_unknown_parameters(sandbox):
    assert [p["id"] for p in search(sandbox.patients, [("identifier", "S6534835")])] == ["S6534835"]
    assert search(sandbox.patients, [("identifier", "s6534835")]) == []  # tokens are exact
    status, body = _answer(sandbox, RECORDED_BASE + "Patient?nam=Peter")
    assert status == 400 and "Unknown search parameter" in body["issue"][0]["diagnostics"]
    status, body = _answer(sandbox, RECORDED_BASE + "Observations?patient=S6534835")
    assert status == 404  # an unknown resource type
    status, body = _answer(sandbox, RECORDED_BASE + "Patient/S6534835&_format=json")
    assert status == 404  # the official harness appends '&_format=json' even without '?'


QUERIES = ["Patient?identifier=S6534835", "Patient?name=Peter Stafford", "Patient?name=Stafford Peter",
           "Patient?name=Pet Staf", "Patient?name=peter&name=stafford", "Patient?family=Stafford&given=Peter",
           "Patient?family=STAFFORD&birthdate=1932-12-29", "Patient?birthdate=1932", "Patient?birthdate=1932-12",
           "Patient?birthdate=gt2000", "Patient?birthdate=le1930-01-01", "Patient?name=zzzz",
           "Patient?family:exact=Stafford", "Patient?gender=female&birthdate=1932", "Patient?name=ST",
           "Patient?given=Peter&family=Stafford&birthdate=1932-12-29", "Patient?identifier=s6534835",
           "Patient?name=peter,stafford", "Patient?nam=Peter", "Observations?patient=S6534835",
           "Patient/S6534835&_format=json", "Patient?birthdate=29-12-1932", "Patient?name=zoë",
           "Observation?patient=S6534835&code=MG&_count=5000"]
"""The searches the official tasks make (and the variants models write), asked of both servers.
`:contains` is left out: whether a HAPI server allows it is configuration (HAPI's default refuses)."""


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    """A real HAPI FHIR server with the snapshot's patients: GRANDROUNDS_FHIR_SERVER (e.g. the MedAgentBench
    image jyxsu6/medagentbench) when set, else HAPI FHIR 8 JPA assembled from Maven Central
    (`.ci/hapi/fetch.sh`, tests/hapi_server.py), else skipped with the reason."""
    import os

    if os.environ.get("GRANDROUNDS_FHIR_SERVER"):
        yield os.environ["GRANDROUNDS_FHIR_SERVER"].rstrip("/") + "/"
        return
    from hapi_server import HapiServer, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    server = HapiServer(tmp_path_factory.mktemp("hapi") / "hapi.log").start()
    try:
        server.load(load_patients(PATIENTS))
        yield server.base
    finally:
        server.stop()


@pytest.mark.slow
def test_sandbox_answers_as_the_real_server(sandbox, real_server):
    import requests

    real = real_server
    for q in QUERIES:
        r = requests.get(real + q + ("" if "_format" in q else "&_format=json"), timeout=60)
        status, ours = sandbox.handle("GET", "/fhir/" + q.replace(" ", "%20"), None)
        assert status == r.status_code, q
        theirs = r.json()
        ids = lambda b: sorted(e["resource"]["id"] for e in b.get("entry", []))  # noqa: E731
        if status != 200:
            continue
        if theirs.get("total") is None:  # HAPI paged it (more than a page): total left out, first page only
            assert set(ids(theirs)) <= set(ids(ours)) and len(ids(ours)) > len(ids(theirs)), q
            continue
        assert (ours["total"], ids(ours)) == (theirs["total"], ids(theirs)), q
        assert ("entry" in ours) == ("entry" in theirs) and list(ours)[:5] == list(theirs)[:5], q
