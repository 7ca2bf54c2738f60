"""AgentClinic OSCE cases: loader, simulated patient, measurement tool (DESIGN §7).

Data (../shared/data/agentclinic, AgentClinic @ b6570ed): `agentclinic_medqa*.jsonl` hold one
`OSCE_Examination` per line (objective for the doctor, the patient actor's information, physical
exam findings, test results, the correct diagnosis); `agentclinic_nejm*.jsonl` hold NEJM image
challenges (the patient's account in `patient_info`, readings in `physical_exams`, five answers of
which one is correct). Both become an `OsceCase`; a file may mix them (the kind is read per line).

As in AgentClinic, the doctor sees only the objective (NEJM: "What is the most likely diagnosis?"),
the patient knows only the patient actor's information (never the diagnosis), and the measurement
reader knows the exam findings and test results. Unlike AgentClinic, the measurement reader here is
not a model: it returns every recorded result whose name (its path in the case, any depth) holds the
request's words, and "NORMAL READINGS" otherwise (AgentClinic's instruction to its reader), so a
test result never depends on a model.
The NEJM image is only a URL and is not shown.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from grandrounds.handlers.cases import CaseFileError
from grandrounds.handlers.text import content_tokens

NEJM_OBJECTIVE = "What is the most likely diagnosis?"
"""AgentClinic's examiner information for NEJM cases."""

# -- the file formats (validated at the boundary) ------------------------------------------------


class _Symptoms(BaseModel):
    model_config = ConfigDict(extra="allow")

    # One record of the extended file has `Symptoms: {}`: tolerated, the history still says it.
    Primary_Symptom: str = ""
    Secondary_Symptoms: list[str] = Field(default_factory=list)


Text = str | list[Any] | dict[str, Any]
"""Patient actor sections are mostly strings; a few records use lists or nested dicts."""


class _PatientActor(BaseModel):
    model_config = ConfigDict(extra="allow")  # Current_Medications, Drug_History, Family_History ...

    Demographics: str = Field(min_length=1)
    History: str = Field(min_length=1)
    Symptoms: _Symptoms
    Past_Medical_History: Text = ""
    Social_History: Text = ""
    Review_of_Systems: Text = ""


class _OsceExamination(BaseModel):
    model_config = ConfigDict(extra="allow")  # one record adds Management_and_Follow_Up

    Objective_for_Doctor: str = Field(min_length=1)
    Patient_Actor: _PatientActor
    Physical_Examination_Findings: dict[str, Any]
    Test_Results: dict[str, Any]
    Correct_Diagnosis: str = Field(min_length=1)


class _MedQARecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    OSCE_Examination: _OsceExamination


class _NejmAnswer(BaseModel):
    text: str = Field(min_length=1)
    correct: bool | Literal["True", "False", "true", "false"]

    @property
    def is_correct(self) -> bool:
        return self.correct is True or (isinstance(self.correct, str) and self.correct.lower() == "true")


class _NejmRecord(BaseModel):
    model_config = ConfigDict(extra="allow")  # `type` in the extended file

    question: str = Field(min_length=1)
    patient_info: str = Field(min_length=1)
    physical_exams: str
    answers: list[_NejmAnswer]
    image_url: str = ""

    @field_validator("answers")
    @classmethod
    def _one_correct(cls, answers: list[_NejmAnswer]) -> list[_NejmAnswer]:
        n = sum(a.is_correct for a in answers)
        if n != 1:
            raise ValueError(f"{n} answers marked correct, expected exactly 1")
        return answers


# -- the domain ----------------------------------------------------------------------------------


class Finding(BaseModel):
    """One recorded result: where it sits in the case (`path`) and what it says."""

    model_config = ConfigDict(frozen=True)

    path: tuple[str, ...]
    """E.g. ("Test_Results", "Imaging", "Chest_CT", "Findings")."""
    value: str


class OsceView(BaseModel):
    """What the doctor may see: the objective only (AgentClinic's examiner information)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    case_id: str
    objective: str
    kind: Literal["osce"] = "osce"
    """The pipeline's case kind (act dispatches on it); the default keeps the view's fields as they were."""


class OsceCase(BaseModel):
    """One AgentClinic OSCE case. In `grandrounds run --env agentclinic` it is carried whole in
    `case.received` (kind `osce`); the correct diagnosis reaches only feedback."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    case_id: str
    kind: Literal["osce"] = "osce"
    source: Literal["medqa", "nejm"]
    objective: str
    patient_facts: tuple[str, ...]
    """The patient actor's information as sentences: what the simulated patient may say."""
    patient_info: str
    """The same information as the patient model is given it (JSON for MedQA, prose for NEJM)."""
    findings: tuple[Finding, ...]
    """Physical exam findings and test results: what the measurement tool may return."""
    test_menu: tuple[str, ...]
    """Names of the recorded test groups (no values), e.g. ("Blood_Tests", "Imaging")."""
    correct_diagnosis: str
    options: tuple[str, ...] = ()
    """NEJM only: the five answer texts (AgentClinic does not show them to the doctor)."""

    def view(self) -> OsceView:
        return OsceView(case_id=self.case_id, objective=self.objective)

    # The names memory policies read of any case (see `FhirCase`): properties, not fields, so they
    # are not part of the case's JSON and carry nothing the fields do not.

    @property
    def question(self) -> str:
        """What memory is retrieved and keyed by: the objective, all the doctor is shown."""
        return self.objective

    @property
    def answer(self) -> str:
        """The grading reference: the correct diagnosis (feedback and reflection only)."""
        return self.correct_diagnosis

    @property
    def category(self) -> str:
        return f"agentclinic-{self.source}"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return "; ".join(_text(v) for v in value if _text(v))
    if isinstance(value, dict):
        return "; ".join(f"{k.replace('_', ' ')}: {_text(v)}" for k, v in value.items() if _text(v))
    return "" if value is None else str(value)


def _flatten(prefix: tuple[str, ...], value: Any) -> list[Finding]:
    if isinstance(value, dict):
        out: list[Finding] = []
        for k, v in value.items():
            out += _flatten(prefix + (str(k),), v)
        return out
    text = _text(value)
    return [Finding(path=prefix, value=text)] if text else []


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text.strip()) if s.strip()]


def _medqa_case(rec: _MedQARecord, case_id: str) -> OsceCase:
    osce = rec.OSCE_Examination
    pa = osce.Patient_Actor
    facts = [f"I am a {pa.Demographics}."] + sentences(pa.History)
    if pa.Symptoms.Primary_Symptom:
        facts.append(f"My main problem is {pa.Symptoms.Primary_Symptom.lower()}.")
    if pa.Symptoms.Secondary_Symptoms:
        facts.append("I have also noticed: " + "; ".join(s.lower() for s in pa.Symptoms.Secondary_Symptoms) + ".")
    for label, value in (("Past medical history", pa.Past_Medical_History), ("Social history", pa.Social_History),
                         ("Review of systems", pa.Review_of_Systems)):
        if _text(value):
            facts.append(f"{label}: {_text(value)}")
    for key, value in (pa.model_extra or {}).items():
        if _text(value):
            facts.append(f"{key.replace('_', ' ')}: {_text(value)}")
    findings = _flatten(("Physical_Examination_Findings",), osce.Physical_Examination_Findings)
    findings += _flatten(("Test_Results",), osce.Test_Results)
    return OsceCase(case_id=case_id, source="medqa", objective=osce.Objective_for_Doctor.strip(),
                    patient_facts=tuple(facts), patient_info=json.dumps(pa.model_dump(), ensure_ascii=False),
                    findings=tuple(findings), test_menu=tuple(osce.Test_Results),
                    correct_diagnosis=osce.Correct_Diagnosis.strip())


_NUMBERED = re.compile(r"\s*\d+\.\s+")


def _nejm_case(rec: _NejmRecord, case_id: str) -> OsceCase:
    # physical_exams is prose, often "...includes: 1. Dermoscopy findings: ... 2. Skin biopsy ...":
    # each numbered item (or sentence) is one finding, keyed by its leading label when it has one.
    body = rec.physical_exams.split(":", 1)[1] if re.search(r"includes?:", rec.physical_exams) else rec.physical_exams
    items = [p.strip() for p in _NUMBERED.split(body) if p.strip()] if _NUMBERED.search(body) else sentences(body)
    findings = []
    for item in items:
        label, sep, rest = item.partition(":")
        findings.append(Finding(path=("Exams", label.strip() if sep and len(label) < 80 else "Reading"),
                                value=(rest if sep and len(label) < 80 else item).strip()))
    gold = next(a.text for a in rec.answers if a.is_correct)
    return OsceCase(case_id=case_id, source="nejm", objective=NEJM_OBJECTIVE,
                    patient_facts=tuple(sentences(rec.patient_info)), patient_info=rec.patient_info.strip(),
                    findings=tuple(findings), test_menu=tuple(f.path[-1] for f in findings if f.path[-1] != "Reading"),
                    correct_diagnosis=gold.strip(), options=tuple(a.text.strip() for a in rec.answers))


def _field(err: dict) -> str:
    return ".".join(str(p) for p in err.get("loc", ())) or "(line)"


def parse_osce_lines(lines: list[str], path: str, prefix: str) -> list[OsceCase]:
    cases: list[OsceCase] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CaseFileError(path, number, None, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(data, dict):
            raise CaseFileError(path, number, None, "an AgentClinic case must be a JSON object")
        case_id = f"{prefix}-{number:03d}"
        try:
            if "OSCE_Examination" in data:
                cases.append(_medqa_case(_MedQARecord.model_validate(data), case_id))
            elif "patient_info" in data or "answers" in data:
                cases.append(_nejm_case(_NejmRecord.model_validate(data), case_id))
            else:
                raise CaseFileError(path, number, None,
                                    "neither an OSCE case (OSCE_Examination) nor a NEJM case (patient_info, answers)")
        except ValidationError as exc:
            err = exc.errors()[0]
            raise CaseFileError(path, number, _field(err), err["msg"].removeprefix("Value error, ")) from None
    if not cases:
        raise CaseFileError(path, None, None, "no cases in file")
    return cases


def load_osce_cases(path: str | Path, limit: int | None = None) -> list[OsceCase]:
    """Every line validated before anything runs; ids `<file stem>-<line>` (stable across runs)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CaseFileError(str(path), None, None, "file not found") from None
    cases = parse_osce_lines(text.splitlines(), str(path), p.stem.removeprefix("agentclinic_"))
    return cases[:limit]


def diagnosis_vocabulary(cases: list[OsceCase]) -> list[str]:
    """The benchmark's label space (every case's diagnosis and NEJM option), for the sim doctor only:
    a closed-world differential, as an MCQ's options are. Sorted, so it carries no case order."""
    seen: dict[str, str] = {}
    for c in cases:
        for d in (c.correct_diagnosis, *c.options):
            seen.setdefault(d.lower(), d)
    return sorted(seen.values(), key=str.lower)


# -- the measurement tool ------------------------------------------------------------------------

# A request names a test the way a clinician would; the data names it in its own way. These few
# equivalences cover the abbreviations that otherwise never match the recorded names.
_SYNONYMS = {
    "cbc": "complete blood count", "bmp": "basic metabolic panel", "cmp": "comprehensive metabolic panel",
    "ecg": "electrocardiogram", "ekg": "electrocardiogram", "emg": "electromyography",
    "eeg": "electroencephalogram", "cxr": "chest xray", "radiograph": "xray", "radiography": "xray",
    "mri": "mri", "magnetic": "mri", "ct": "ct", "computed": "ct", "lp": "lumbar puncture",
    "csf": "cerebrospinal fluid", "abg": "arterial blood gas", "ua": "urinalysis", "lfts": "liver function",
    "lft": "liver function", "tsh": "thyroid stimulating hormone", "us": "ultrasound", "sonography": "ultrasound",
    "echo": "echocardiogram", "pe": "physical", "physical exam": "physical", "labs": "laboratory",
    "lab": "laboratory", "neurologic": "neurological", "dermatologic": "dermatological",
}
_GENERIC = frozenset({"test", "tests", "result", "results", "level", "levels", "findings", "finding", "panel",
                      "exam", "exams", "examination", "examinations", "study", "studies", "reading", "readings",
                      "value", "values", "order", "please", "check", "request", "the", "of", "and", "for", "a",
                      "an", "my", "patient", "s", "full", "complete_"})
_WORD = re.compile(r"[a-z0-9]+")
_XRAY = re.compile(r"\bx[\s_-]*rays?\b")


def _request_terms(text: str) -> set[str]:
    """Distinctive words of a test name, case-insensitive: `X-Ray`/`x ray`/`Xray` are one word, a few
    abbreviations are expanded, generic words (test, exam, results) dropped, words cut to 5 letters
    (so "abdomen" meets "abdominal" and "tests" meets "test")."""
    t = _XRAY.sub(" xray ", text.lower().replace("_", " ").replace("-", " "))
    out: set[str] = set()
    for w in _WORD.findall(t):
        out.update(_WORD.findall(_SYNONYMS.get(w, w)))
    return {w[:5] for w in out if w not in _GENERIC and len(w) > 1}


NORMAL = "NORMAL READINGS"
"""AgentClinic's instruction to its measurement reader for results not in its data."""
_TOP = {"Physical_Examination_Findings": "physical", "Test_Results": "", "Exams": ""}


class MeasurementTool:
    """Returns the case's recorded results for a requested exam or test, `NORMAL READINGS` otherwise.

    AgentClinic's reader is a model given every physical examination finding and every test result
    (`exam_information`: the exam findings with the tests nested under them); this one is
    deterministic, so a result never depends on a model. A recorded result answers a request when
    every distinctive word of the request is in the result's name: its whole path in the case,
    top level included, case-insensitive ("Physical examination" -> every physical examination
    finding; "Chest_X-Ray" -> Imaging > Chest X-ray, never the chest CT; "Vital signs" -> the vital
    signs). A group named exactly as requested wins over names that merely contain the words. A
    request with no distinctive word ("REQUEST TEST: exam") answers nothing.
    """

    def __init__(self, case: OsceCase):
        self.case = case
        self.requests: list[tuple[str, list[Finding]]] = []

    @staticmethod
    def _name_terms(f: Finding) -> set[str]:
        terms = {_TOP.get(f.path[0], "")} - {""}
        for p in f.path[1:] if f.path[0] in _TOP else f.path:
            terms |= _request_terms(p)
        return {t[:5] for t in terms}

    def request(self, test: str) -> str:
        want = _request_terms(test)
        found = [f for f in self.case.findings if want and want <= self._name_terms(f)]
        # a result group named exactly as requested ("Blood tests" -> Blood_Tests) beats one that only
        # shares the words (Vital_Signs > Blood_Pressure)
        exact = [f for f in found if any(_request_terms(p) == want for p in f.path)]
        found = exact or found
        self.requests.append((test, found))
        if not found:
            return f"RESULTS: {NORMAL} (no recorded result for {test.strip() or 'an unnamed test'})"
        return "RESULTS: " + "; ".join(f"{' > '.join(f.path[1:]).replace('_', ' ')}: {f.value}" for f in found)


# -- the rule-based patient (sim) ----------------------------------------------------------------

_OPENERS = frozenset({"bring", "today", "probl", "wrong", "help", "conce", "compl"})


def _stems(text: str) -> set[str]:
    """Content words cut to five letters: a crude stemmer, so "smoke" meets "smoker"."""
    return {t[:5] for t in content_tokens(text)}


class RulePatient:
    """Answers from the patient's own facts, by word overlap with the question; deterministic.

    An opening question ("what brings you in?") or one that overlaps nothing gets the main problem
    (the first history sentence). It never says more than two facts at a time, and knows nothing the
    patient actor was not given (so it cannot reveal the diagnosis unless the case itself does).
    """

    def __init__(self, case: OsceCase):
        self.case = case

    async def answer(self, question: str, transcript: list[tuple[str, str]]) -> str:
        q = _stems(question)
        facts = self.case.patient_facts
        if not facts:
            return "I'm not sure, doctor."
        scored = sorted(((len(_stems(f) & q), -i) for i, f in enumerate(facts)), reverse=True)
        if not q & _OPENERS and scored[0][0] > 0:
            picked = [-i for s, i in scored[:2] if s > 0 and s >= scored[0][0] / 2]
        else:
            picked = [1 if len(facts) > 1 else 0]
        return " ".join(facts[i] for i in sorted(picked))


# -- the model-played patient (openai) -----------------------------------------------------------

PATIENT_SYSTEM = (
    "You are a patient in a clinic who only responds in the form of dialogue. You are being inspected by a "
    "doctor who will ask you questions and will perform exams on you in order to understand your disease. "
    "Your answer will only be 1-3 sentences in length.\n\nBelow is all of your information. {info}. \n\n"
    "Remember, you must not reveal your disease explicitly but may only convey the symptoms you have in the "
    "form of dialogue if you are asked.")
"""AgentClinic's patient prompt (without the bias variants)."""


class LLMPatient:
    """The patient played by a model through the gateway (AgentClinic's PatientAgent), each reply
    recorded by `recorder` (stage `patient`) before it is used. It is given the patient actor's
    information only, never the diagnosis."""

    def __init__(self, case: OsceCase, gateway, recorder):
        self.case, self.gateway, self.recorder = case, gateway, recorder

    async def answer(self, question: str, transcript: list[tuple[str, str]]) -> str:
        messages = [{"role": "system", "content": PATIENT_SYSTEM.format(info=self.case.patient_info)}]
        for doctor, patient in transcript:
            if not doctor:  # a test result, added to the patient's history as AgentClinic does
                messages.append({"role": "user", "content": f"Measurement: {patient}"})
                continue
            messages += [{"role": "user", "content": f"Doctor: {doctor}"}, {"role": "assistant", "content": patient}]
        messages.append({"role": "user", "content": f"Doctor: {question}"})
        reply = await self.gateway.complete(messages, self.recorder, f"patient-turn-{len(transcript) + 1}")
        return reply.text.strip().removeprefix("Patient:").strip()
