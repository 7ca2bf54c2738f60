"""Identifiers stay with their patient: a MedAgentBench run (the local FHIR sandbox, the sim backbone and
a scripted model) never shows one patient's identifiers to another patient's case.

Every identifier of patient A (MRN, name, date of birth, phone, address, from the snapshot's Patient
resource) is searched for in every event of patient B that reaches B's agent or memory: memory retrieved
for B, per-step memory, the model exchanges (prompts) of B's case, and every memory event at all."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import MAB_PATIENTS as PATIENTS, MAB_TASKS, needs_medagentbench
from fhir_helpers import FhirFake, offline_tasks_file, run_fhir
from llm_helpers import SECRET
from grandrounds.handlers.deidentify import PLACEHOLDERS, SubjectScrubber, patient_terms
from grandrounds.store.events import payload_class
from grandrounds.store.eventstore import EventStore

pytestmark = needs_medagentbench

SERVED_TO_CASE = ("memory.retrieved", "llm.exchange")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return offline_tasks_file(tmp_path_factory.mktemp("mab"))


@pytest.fixture(scope="module")
def patients() -> dict[str, dict]:
    return {p["id"]: p for p in json.loads(PATIENTS.read_text())}


def identifiers(resource: dict) -> set[str]:
    """What would identify the patient to a reader: MRN, full and family name, birth date, phone, street."""
    out = {resource["id"], resource["birthDate"]}
    for n in resource.get("name", []):
        out.add(" ".join([*n["given"], n["family"]]))
        out.add(n["family"])
    out |= {t["value"] for t in resource.get("telecom", [])}
    out |= {line for a in resource.get("address", []) for line in a.get("line", [])}
    return out


def _found(text: str, needles: set[str]) -> set[str]:
    low = text.lower()
    return {n for n in needles if re.search(r"(?<!\w)" + re.escape(n.lower()) + r"(?!\w)", low)}


def _patient_of(events) -> dict[str, str | None]:
    out = {}
    for e in events:
        if e.type == "case.received":
            out[e.case_id] = e.payload["case"].get("eval_mrn")
    return out


def _check_run(db: Path, run_id: str, patients: dict[str, dict]) -> tuple[int, int]:
    """(cross-patient pairs checked, memory events checked); asserts no leak."""
    with EventStore(str(db), read_only=True) as s:
        events = s.read(run_id)
    of = _patient_of(events)
    mrns = {m for m in of.values() if m}
    assert len(mrns) >= 5, of
    served: dict[str, list[str]] = {}
    for e in events:
        if e.case_id is None:
            continue
        if e.type in SERVED_TO_CASE:
            served.setdefault(e.case_id, []).append(json.dumps(e.payload, ensure_ascii=False))
        elif e.type == "answer.given":  # per-step memory injected into the agent's turns
            served.setdefault(e.case_id, []).extend(
                s["content"] for s in e.payload["steps"] if s["kind"] == "memory")
    pairs = 0
    for b_case, b_mrn in of.items():
        text = "\n".join(served.get(b_case, []))
        own = identifiers(patients[b_mrn]) if b_mrn else set()
        for a_mrn in mrns - {b_mrn}:
            leaked = _found(text, identifiers(patients[a_mrn]) - own)
            assert not leaked, f"{b_case} (patient {b_mrn}) was served {sorted(leaked)} of patient {a_mrn}"
            pairs += 1
    every = set().union(*(identifiers(patients[m]) for m in mrns))
    memory = [e for e in events if payload_class(e.type).carries_memory]
    assert memory
    for e in memory:
        leaked = _found(json.dumps(e.payload, ensure_ascii=False), every)
        assert not leaked, f"memory event {e.type} of {e.case_id} keeps {sorted(leaked)}"
    return pairs, len(memory)


POLICIES = {"evo-medagent": None, "skemex": 'name = "skemex"\nwindow = 1\nbuffer_gating = false\n',
            "selsm": None, "retrosum": None}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_patient_identifier_reaches_another_patients_case(policy, tasks, patients, tmp_path):
    arg = policy
    if POLICIES[policy]:
        arg = str(tmp_path / f"{policy}.toml")
        Path(arg).write_text(POLICIES[policy])
    db = tmp_path / "run.duckdb"
    code, out = run_fhir(tasks, db, "--policy", arg)
    assert code == 0, out
    pairs, memory = _check_run(db, out["run_id"], patients)
    assert pairs >= 40 and memory >= 8
    # `run --json` reports the placeholders written, by type
    assert out["deidentified"] and set(out["deidentified"]) <= set(PLACEHOLDERS.values()), out.get("deidentified")
    with EventStore(str(db), read_only=True) as s:
        text = json.dumps([e.payload for e in s.read(out["run_id"]) if payload_class(e.type).carries_memory])
    assert "[MRN]" in text or "[NAME]" in text  # the writes did hold identifiers, now placeholders


def test_prompts_of_a_model_run_carry_no_other_patients_identifiers(patients, tmp_path):
    """A model backbone (the scripted FHIR agent and reflector), six task-1 patients: every recorded
    prompt (`llm.exchange`) of each is searched for the others' identifiers."""
    db = tmp_path / "model.duckdb"
    with FhirFake() as fake:
        code, out = run_fhir(MAB_TASKS, db, "--protocol", "react", "--backbone", "openai", "--model", "fake",
                             "--base-url", fake.base_url, "--task-type", "1", "--limit", "6",
                             env={"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""})
    assert code == 0, out
    with EventStore(str(db), read_only=True) as s:
        assert any(e.type == "llm.exchange" for e in s.read(out["run_id"]))
    _check_run(db, out["run_id"], patients)


def test_scrubber_replaces_structured_and_pattern_identifiers(patients):
    p = patients["S6534835"]
    s = SubjectScrubber(patient_terms(p))
    text = (f"Patient {p['name'][0]['given'][0]} {p['name'][0]['family']} (MRN S6534835), born "
            f"{p['birthDate']}, phone {p['telecom'][0]['value']}, lives at {p['address'][0]['line'][0]}; "
            "see http://localhost:8080/fhir/Patient?family=x, mail jo@example.org, seen on March 3, 2021. "
            "stafford peter presented with 96 mm/h ESR.")
    out = s.text(text)
    for ident in identifiers(p) | {"http://localhost", "jo@example.org", "March 3, 2021"}:
        assert ident.lower() not in out.lower(), (ident, out)
    for kind in ("name", "mrn", "dob", "phone", "address", "url", "email", "date"):
        assert PLACEHOLDERS[kind] in out, (kind, out)
    assert "96 mm/h ESR" in out  # clinical values stay


def test_a_recorded_fhir_call_stays_a_parseable_call_without_host_or_identifiers(patients):
    """The policies' writers read a recorded `tool` step as JSON (function name, method, URL): de-identifying
    it must keep it JSON and keep what the call means (resource type, parameter names), while the host and
    every identifier go. A URL span that ran on through the closing quote broke the record, and the skills
    written from it read "a FHIR call" with no required tool."""
    p = patients["S6534835"]
    s = SubjectScrubber(patient_terms(p))
    call = {"accepted": True, "method": "GET", "name": "get_observation_labs",
            "url": "http://localhost:8080/fhir/Observation?patient=S6534835&code=GLU&date=ge2023-11-12T10:15:00+00:00"
                   "&_format=json"}
    other = {"method": "GET", "url": f"http://127.0.0.1:8080/fhir/Patient?family={p['name'][0]['family']}"
                                     "&birthdate=1932-12-29&identifier=S1234567#x"}
    read = {"method": "GET", "url": "http://localhost:8080/fhir/Patient/S7654321/_history/2"}
    bundle = {"meta": {"lastUpdated": "2023-11-13T10:15:00.000+00:00"}, "link": [{"url": "https://hl7.org/x"}]}
    out = [json.loads(s.text(json.dumps(x))) for x in (call, other, read, bundle)]
    assert out[0] == {**call, "url": "[URL]/Observation?patient=[MRN]&code=GLU&date=ge[DATE]&_format=json"}
    assert out[1]["url"] == "[URL]/Patient?family=[NAME]&birthdate=[DOB]&identifier=[MRN]"
    assert out[2]["url"] == "[URL]/Patient/[ID]/_history/[ID]"
    assert out[3] == {"meta": {"lastUpdated": "[DATE]"}, "link": [{"url": "[URL]"}]}
