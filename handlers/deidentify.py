"""Patient identifiers stay with their patient: memory written from a case is de-identified first.

Every event that carries memory (`EventPayload.carries_memory`: episodes, rules, skills, SELSM
records, RetroSum lessons, feedback) passes through `Deidentifier.scrub` in `EventWriter.emit`,
before the projection folds it, so no item is ever retrievable with an identifier in it. Two
passes, both replacing a span with a typed placeholder (`[NAME]`, `[MRN]`, `[DOB]`, ...):

1. the case's own identifiers, exactly: from its structured patient data (MedAgentBench: the
   patient whose MRN the task names, looked up in the environment's snapshot — names, MRN and
   other identifiers, date of birth in several spellings, address parts, phone, e-mail) and the
   names, ids and dates the case text itself states ("with name Peter Stafford and DOB of ...");
   matched case-insensitively on word boundaries, so lower-cased trigger terms are caught too;
2. the SELSM entity checker's patterns (`policies/selsm/entity_check.py`) for what no record
   names: URLs, e-mail, phone numbers, MRN-like and other identifiers, honorific/"named" names,
   calendar dates. Numbers that are merely clinical values are left alone (instance numbers are
   the checker's business, not a privacy matter), and texts the case's options quote (an eponym
   like "Charles Bonnet syndrome") pass.

Ids of memory items, case ids, tool names and enum-like fields are not text and are never touched
(`_KEEP`). The pass is a pure function of the payload and the case, so replays write the same bytes.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, Iterable

from grandrounds.handlers.policies.selsm.entity_check import (FHIR_RESOURCE_TYPES, allow_eponyms, entity_candidates,
                                                              find_entities)
from grandrounds.store.event_types import CaseReceived
from grandrounds.store.events import EventPayload

PLACEHOLDERS = {
    "name": "[NAME]", "mrn": "[MRN]", "identifier": "[ID]", "dob": "[DOB]", "date": "[DATE]",
    "address": "[ADDRESS]", "phone": "[PHONE]", "email": "[EMAIL]", "url": "[URL]",
}
"""Placeholder per identifier type; audit shows them as they are."""

_PLACEHOLDER_RE = re.compile(r"\[(?:" + "|".join(v[1:-1] for v in PLACEHOLDERS.values()) + r")\]")

_KEEP = frozenset({
    "rule_id", "episode_id", "case_id", "source_case_id", "skill_id", "record_id", "experience_id", "id",
    "ids", "target_id", "into", "merged_into", "tool", "status", "branch", "op", "kind", "label", "old", "new",
    "outcome", "category", "audience", "purpose", "adoption", "role", "stage",
})
"""Payload keys whose values are identifiers of memory or enums, not text from the case."""

_MRN_LIKE = re.compile(r"^(?:MRN\b.*|[A-Z]{1,3}\d{5,})$", re.I)
_STATED_NAME = re.compile(r"\b(?:name(?:d| is|:)?|called|patient)\s+([A-Z][a-z'-]+(?:\s+[A-Z][a-z'-]+){0,2})")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")

_SEARCH_PREFIX = re.compile(r"^(?:eq|ne|gt|lt|ge|le|sa|eb|ap)(?=\d)")
"""FHIR search prefixes (`date=ge2023-…`): kept, so the value behind them is scrubbed as a date."""

_PERSON_PARAMS = {
    "name": "name", "given": "name", "family": "name", "birthdate": "dob", "identifier": "mrn", "patient": "mrn",
    "subject": "mrn", "_id": "mrn", "telecom": "phone", "phone": "phone", "email": "email", "address": "address",
    "address-city": "address", "address-postalcode": "address",
}
"""FHIR search parameters whose value names a person: replaced by their type whatever the value looks like."""

PatientDirectory = Callable[[str], "dict | None"]
"""MRN -> the patient's FHIR Patient resource, or None (the environment's snapshot)."""


def _dob_spellings(iso: str) -> list[str]:
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", iso)
    if not m:
        return [iso]
    y, mo, d = m.groups()
    month = _MONTHS[int(mo) - 1]
    return [iso, f"{mo}/{d}/{y}", f"{int(mo)}/{int(d)}/{y}", f"{d}.{mo}.{y}", f"{month} {int(d)}, {y}",
            f"{int(d)} {month} {y}"]


def patient_terms(resource: dict) -> list[tuple[str, str]]:
    """(text, type) of every identifier a FHIR Patient resource holds."""
    out: list[tuple[str, str]] = []
    if resource.get("id"):
        out.append((str(resource["id"]), "mrn"))
    for ident in resource.get("identifier", []) or []:
        if ident.get("value"):
            out.append((str(ident["value"]), "mrn"))
    for name in resource.get("name", []) or []:
        given = [g for g in name.get("given", []) or [] if g]
        family = name.get("family") or ""
        if given and family:
            out.append((" ".join([*given, family]), "name"))
            out.append((f"{family}, {' '.join(given)}", "name"))
        out += [(part, "name") for part in [*given, family] if len(part) >= 2]
        if name.get("text"):
            out.append((name["text"], "name"))
    if resource.get("birthDate"):
        out += [(s, "dob") for s in _dob_spellings(str(resource["birthDate"]))]
    for addr in resource.get("address", []) or []:
        out += [(line, "address") for line in addr.get("line", []) or [] if line]
        for part in ("city", "postalCode", "text"):
            if addr.get(part):
                out.append((str(addr[part]), "address"))
    for tel in resource.get("telecom", []) or []:
        if tel.get("value"):
            out.append((str(tel["value"]), "email" if tel.get("system") == "email" else "phone"))
    return out


def case_text(case: dict) -> str:
    return "\n".join(str(case.get(k) or "") for k in ("question", "instruction", "context"))


def stated_terms(text: str) -> list[tuple[str, str]]:
    """Identifiers the case text itself states: names ("with name Peter Stafford"), MRNs, dates, URLs."""
    out: list[tuple[str, str]] = []
    for m in _STATED_NAME.finditer(text):
        words = m.group(1).split()
        out.append((m.group(1), "name"))
        out += [(w, "name") for w in words if len(w) >= 2]
    for v in find_entities(text):
        if v.category == "identifier":
            out.append((v.match, "mrn" if _MRN_LIKE.match(v.match) else "identifier"))
        elif v.category in ("name", "url", "email", "phone", "date"):
            out.append((v.match, v.category))
    return out


_SPANS: dict[str, tuple] = {}
_SPANS_KEPT = 4096
_IDENTIFYING = frozenset({"name", "url", "email", "phone", "date", "identifier"})


def _identifying_spans(s: str, allowed_low: str) -> list[tuple[str, str]]:
    """(category, span) of the identifying entities in `s` (`find_entities`, less instance numbers and
    placeholders already written; the first-name pairs the case's options quote pass), in its order.
    The scan is memoised per string alone (`entity_candidates`), not per (string, case): it is a pure
    function of the text, and a run scrubs the same strings over and over (a rule's text in every
    retrieval that shows it, trigger words, the case question in each of its memory events), each a
    pass of some twenty patterns, while the options only decide which first-name pairs pass. Keyed
    by case too, most lookups missed (every case has its own options). Bounded: the oldest goes first."""
    candidates = _SPANS.get(s)
    if candidates is None:
        candidates = tuple((c, span, pair) for c, span, pair in entity_candidates(s)
                           if c in _IDENTIFYING and not _PLACEHOLDER_RE.fullmatch(span))
        if len(_SPANS) >= _SPANS_KEPT:
            del _SPANS[next(iter(_SPANS))]
        _SPANS[s] = candidates
    if not candidates:
        return []
    out: list[tuple[str, str]] = []
    for found in allow_eponyms(candidates, allowed_low):
        if found not in out:  # each span once, as find_entities reports it
            out.append(found)
    return out


class SubjectScrubber:
    """The two passes for one case: its own identifiers, then the generic patterns."""

    def __init__(self, terms: Iterable[tuple[str, str]], allowed_text: str = ""):
        # Longest first, so "Peter Stafford" is one [NAME], not two.
        uniq = {}
        for text, kind in terms:
            text = text.strip()
            if len(text) >= 2 and text.lower() not in uniq:
                uniq[text.lower()] = (text, kind)
        self.terms = sorted(uniq.values(), key=lambda t: (-len(t[0]), t[0].lower()))
        self._re = (re.compile(r"(?<![\w])(?:" + "|".join(re.escape(t) for t, _ in self.terms) + r")(?![\w])", re.I)
                    if self.terms else None)
        self._kind = {t.lower(): k for t, k in self.terms}
        self.allowed_text = allowed_text
        self._allowed_low = allowed_text.lower()
        self.found: Counter[str] = Counter()

    def text(self, s: str) -> str:
        if not s:
            return s
        if self._re is not None:
            s = self._re.sub(self._replace_term, s)
        for category, match in _identifying_spans(s, self._allowed_low):
            kind = "mrn" if category == "identifier" and _MRN_LIKE.match(match) else category
            n = s.count(match)
            if n:
                self.found[kind] += n
                s = s.replace(match, self._url(match) if kind == "url" else PLACEHOLDERS[kind])
        return s

    def _url(self, url: str) -> str:
        """A URL without its host and identifiers, keeping what a FHIR call means: `[URL]` for scheme, host
        and base path, then the resource types of its path (other path segments, ids, as `[ID]`) and its
        search parameters' names with their values scrubbed (a person's name, birth date or id by the
        parameter's type). A recorded call `GET http://host/fhir/Patient?identifier=S6534835` is kept as
        `[URL]/Patient?identifier=[MRN]`, so the policies' writers can still describe the action pattern
        ("GET Patient?identifier=…"). A URL with no resource type in its path is `[URL]` whole."""
        rest = url.split("://", 1)[-1].partition("#")[0]
        path, _, query = rest.partition("?")
        segments = path.split("/")[1:]  # [0] is the host
        first = next((i for i, x in enumerate(segments) if x in FHIR_RESOURCE_TYPES), None)
        if first is None:
            return PLACEHOLDERS["url"]
        kept = [x if x in FHIR_RESOURCE_TYPES or _PLACEHOLDER_RE.fullmatch(x) or x.startswith(("$", "_"))
                else PLACEHOLDERS["identifier"] for x in segments[first:] if x]
        params = []
        for pair in query.split("&") if query else []:
            name, eq, value = pair.partition("=")
            kind = _PERSON_PARAMS.get(name.split(":", 1)[0].lower())
            if value and kind and not _PLACEHOLDER_RE.fullmatch(value):
                self.found[kind] += 1
                value = PLACEHOLDERS[kind]
            elif value:
                prefix = _SEARCH_PREFIX.match(value)
                cut = prefix.end() if prefix else 0
                value = value[:cut] + self.text(value[cut:])
            params.append(name + eq + value)
        return "/".join([PLACEHOLDERS["url"], *kept]) + ("?" + "&".join(params) if params else "")

    def _replace_term(self, m: re.Match) -> str:
        kind = self._kind[m.group(0).lower()]
        self.found[kind] += 1
        return PLACEHOLDERS[kind]

    def value(self, v: Any, key: str | None = None) -> Any:
        if key in _KEEP:
            return v
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(x, k) for k, x in v.items()}
        return v


class Deidentifier:
    """Scrubs the memory events a run's writer emits; one per run (`EventWriter.deidentifier`).

    Knows each case from its `case.received` event (seen as it is emitted, or read back from the
    log when a case resumes in a new process) and its patient from the environment's directory.
    """

    def __init__(self, store, run_id: str, directory: Callable[[], PatientDirectory | None] = lambda: None):
        self.store = store
        self.run_id = run_id
        self.directory = directory
        self._cases: dict[str, dict] = {}
        self._scrubbers: dict[str, SubjectScrubber] = {}
        self.found: Counter[str] = Counter()
        """Placeholders written so far, by type (reported by `grandrounds run --json` as `deidentified`)."""

    def observe(self, payload: EventPayload, case_id: str | None) -> None:
        if isinstance(payload, CaseReceived) and case_id is not None:
            self._cases[case_id] = payload.case
            if len(self._cases) > 256:  # the cases in flight (a policy that writes no memory never trims below)
                self._cases.pop(next(iter(self._cases)))

    def scrubber(self, case_id: str | None) -> SubjectScrubber:
        key = case_id or ""
        found = self._scrubbers.get(key)
        if found is not None:
            return found
        case = self._cases.get(key) if case_id else None
        if case is None and case_id is not None:
            recorded = self.store.read(self.run_id, types=["case.received"], case_id=case_id)
            case = recorded[0].decode().case if recorded else None
        terms: list[tuple[str, str]] = []
        allowed = ""
        if case:
            mrn = case.get("eval_mrn") or case.get("subject")
            if mrn:
                terms.append((str(mrn), "mrn"))
                lookup = self.directory()
                resource = lookup(str(mrn)) if lookup is not None else None
                if resource:
                    terms += patient_terms(resource)
            terms += stated_terms(case_text(case))
            allowed = " | ".join(str(v) for v in (case.get("options") or {}).values())
        found = self._scrubbers[key] = SubjectScrubber(terms, allowed)
        if len(self._scrubbers) > 256:  # a long run: keep the recent cases only
            self._scrubbers.pop(next(iter(self._scrubbers)))
            self._cases.pop(next(iter(self._cases)), None)
        return found

    def scrub(self, payload: EventPayload, case_id: str | None) -> EventPayload:
        """The payload with every identifier replaced, as a new model of the same type."""
        return self.scrub_dumped(payload, case_id)[0]

    def scrub_dumped(self, payload: EventPayload, case_id: str | None) -> tuple[EventPayload, dict | None]:
        """`scrub`, and the JSON-mode dump the scan read when nothing was found: the returned payload is
        then the very object dumped, so the writer can store that dump (`NewEvent.dumped`) instead of
        dumping it again. None when something was replaced (the new model is dumped when written)."""
        s = self.scrubber(case_id)
        s.found.clear()
        dumped = payload.model_dump(mode="json")
        clean = s.value(dumped)  # (builds new containers: `dumped` itself is left as it was)
        if not s.found:
            return payload, dumped  # nothing found: the very same object (and bytes)
        self.found.update(s.found)
        return type(payload).model_validate(clean), None
