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

Since issue 32 (the policy config's `deidentify_patterns = 2`, `memory_min_subjects = k`, recorded per run):
pass 1 also takes the case's structured `identifiers` (handlers/cases.py `CaseIdentifiers`) and what the
free-text patterns (`free_text_terms`: names without an honorific, international phones, addresses,
record numbers, more date formats) find in the case text; and a third pass, the k-subjects rule
(handlers/subject_gate.py), withholds every word of the case that fewer than k subjects' cases hold
(`[...]`), so what no pattern recognises still stays with its patient. Retrieval queries of the case
lose the same words (`RunContext.retrieval_text`). Runs recorded before keep patterns 1 and k = 1.

Since issue 41 (`deidentify_patterns = 3`, the default for new runs): the k-subjects rule no longer reads
the whole text. A field tool (handlers/field_deidentifier.py: philter-lite, pinned, with the Safe Harbor
rules it lacks) reads the case's text once and its spans become exact terms of pass 1, typed (`[NAME]`,
`[PLACE]`, `[DATE]`, `[AGE 90+]`, `[ID]`, `[CONTACT]`); the k-subjects evidence decides only the spans the
tool flags but cannot place (a capitalised word on none of its lists: a surname, a village, or an eponym
such as "Kussmaul"): kept when at least k subjects' cases hold every word of it, withheld as its kind
otherwise. Every other word of the case is kept, so memory keeps its findings. The tool's versions and
configuration digest are recorded in `run.started` (handlers/code_versions.py). Pattern set 4 (the default
since) is the same with the tool's rules version 2 (more Safe Harbor items found; eponyms, number words,
countries and seasons not of a year kept: handlers/field_deidentifier.py `_not_identifiers`).

Ids of memory items, case ids, tool names and enum-like fields are not text and are never touched
(`_KEEP`). The pass is a pure function of the payload and the case, so replays write the same bytes.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, Iterable

from grandrounds.handlers.policies.selsm.entity_check import (FHIR_RESOURCE_TYPES, allow_eponyms, entity_candidates,
                                                              find_entities)
from grandrounds.handlers.field_deidentifier import (AREA_CODE_PHONE, INTERNATIONAL_PHONE, is_large_place,
                                                     rules_version)
from grandrounds.handlers.subject_gate import WITHHELD, WORD, SubjectCounts, gate_text
from grandrounds.handlers.text import STOPWORDS, key_terms
from grandrounds.store.event_types import CaseReceived
from grandrounds.store.events import EventPayload

PLACEHOLDERS = {
    "name": "[NAME]", "mrn": "[MRN]", "identifier": "[ID]", "dob": "[DOB]", "date": "[DATE]",
    "address": "[ADDRESS]", "phone": "[PHONE]", "email": "[EMAIL]", "url": "[URL]",
    "withheld": WITHHELD,
    # the field tool's kinds without a placeholder above (pattern set 3)
    "place": "[PLACE]", "age": "[AGE 90+]", "contact": "[CONTACT]",
}
"""Placeholder per identifier type; audit shows them as they are. `withheld`: words of the case that
fewer than k subjects' cases hold (the k-subjects rule, handlers/subject_gate.py)."""

MEANINGS = {
    "name": "a person's name", "mrn": "a medical record number", "identifier": "an identifier",
    "dob": "a date of birth", "date": "a date (its year kept)", "address": "an address",
    "phone": "a phone number", "email": "an e-mail address", "url": "a web address",
    "withheld": "a word fewer than k patients' cases hold", "place": "a place",
    "age": "an age over 89", "contact": "a phone, fax or e-mail contact",
}
"""What each placeholder stands for, in words (the web view's titles, grandrounds/ui/app.py)."""

_PLACEHOLDER_RE = re.compile("|".join(re.escape(v) for v in PLACEHOLDERS.values()))
_PLACEHOLDERS_ONLY = re.compile(r"(?:\s*(?:" + _PLACEHOLDER_RE.pattern + r")[\s,;:-]*)+")
_PLACEHOLDER_WORDS = frozenset(v[1:-1] for v in PLACEHOLDERS.values() if v[1:-1].isalpha())
_TRIGGER_KEYS = frozenset({"trigger"})
"""The list fields that trigger memory (evo-medagent rules and episodes, retrosum lessons, selsm skills,
skemex skill bodies): matched word by word against the next case, so never left empty by scrubbing."""

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


# --- free-text patterns (pattern set 2, issue 32): read on the case's own text once per case ---------
# They find spans in the vignette ("Eleanor Vasquez-Whitfield, a 40-year-old man ... from Millbrook Falls
# ... phone +44 20 7946 0958"); each span then becomes an exact term scrubbed from every memory text of
# the case, so a lower-cased trigger word ("whitfield") goes too. Case text only: memory strings are not
# scanned with them (what a writer copies from the case is caught as the exact term, and what the case
# holds that no pattern sees is the k-subjects rule's business).

_CAP = r"[A-Z][a-z'’]+(?:-[A-Z][a-z'’]+)?"
"""A capitalised name word, double-barrelled ones included (Vasquez-Whitfield, O'Neill)."""
_CAPS = _CAP + r"(?:\s+" + _CAP + r"){0,3}"
_AGE = r"(?:is\s+)?an?\s+\d{1,3}[- ](?:year|month|week|day)s?[- ]old\b"
_NOT_A_NAME = frozenset("""
today yesterday tonight overnight currently recently initially later earlier then now here there patient
monday tuesday wednesday thursday friday saturday sunday january february march april may june july august
september october november december she he they her his the this that these a an on in at after before
""".split())
"""Capitalised words that start a sentence rather than name someone ("Today, a 40-year-old ...")."""

_STREET = (r"(?:Street|St|Road|Rd|Avenue|Ave|Lane|Ln|Drive|Dr|Court|Ct|Close|Way|Place|Pl|Boulevard|Blvd|"
           r"Terrace|Crescent|Cres|Square|Sq|Highway|Hwy|Parkway|Pkwy|Row|Gardens|Grove|Mews|Walk|Circle|Loop|Trail)")
_MONTHS3 = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*"

_FREE_TEXT: list[tuple[str, re.Pattern[str], int]] = [
    # names without an honorific: "Eleanor Vasquez-Whitfield, a 40-year-old man", "Ann Lee (MRN ...)",
    # "Pat Kim, aged 71", "NAME: Tom Reyes", "his wife, Maria Delgado,", "signed by Jane Doe"
    ("name", re.compile(r"(?:^|(?<=[.;:!?(\n,]\s)|(?<=[(\n]))(" + _CAPS + r")\s*,?\s+" + _AGE,
                        re.M), 1),
    ("name", re.compile(r"\b(" + _CAPS + r")\s*,?\s*\((?i:MRN|DOB|D\.O\.B|born|NHS|hospital|record|age|aged|"
                        r"\d{1,3}\s*(?:y|yo|yrs?|years?)\b)"), 1),
    ("name", re.compile(r"\b(" + _CAPS + r"),\s+(?:aged?|age)\s+\d{1,3}\b"), 1),
    ("name", re.compile(r"\b(?:[Nn]ame|NAME|[Pp]atient|PATIENT|[Pp]t)\s*[:=]\s*(" + _CAPS + r")"), 1),
    ("name", re.compile(r"\b(?:[Ww]ife|[Hh]usband|[Mm]other|[Ff]ather|[Dd]aughter|[Ss]on|[Pp]artner|[Ss]ister|[Bb]rother|"
                        r"[Cc]arer|[Cc]aregiver|[Gg]uardian|[Nn]ext of kin|[Ss]igned by|[Rr]eferred by|[Ss]een by)\s*,?\s+(" + _CAPS + r")"), 1),
    # surname first, in capitals: "VASQUEZ-WHITFIELD, Eleanor"
    ("name", re.compile(r"\b([A-Z]{2,}(?:-[A-Z]{2,})?,\s+" + _CAP + r")\b"), 1),
    # phones: international (+44 20 7946 0958, +49 (0)30 1234567, 0044 ...), parenthesised area codes
    # ((555) 0100-7000, (020) 7946 0958), national trunk numbers (07700 900123, 01 23 45 67 89),
    # and whatever follows "phone/tel/mobile" (checked for at least 7 digits below)
    ("phone", INTERNATIONAL_PHONE, 0),
    ("phone", AREA_CODE_PHONE, 0),
    ("phone", re.compile(r"(?<![\w.,/-])0\d{1,4}(?:[\s.-]\d{2,6}){1,4}(?![\w,/-]|\.\d)"), 0),
    ("phone", re.compile(r"\b(?:phone|tel|telephone|mobile|cell|contact|fax|pager|whatsapp)\.?(?:\s*(?:no\.?|number|#))?"
                         r"\s*[:#]?\s*(\+?[\d(][\d\s().-]{5,}\d)", re.I), 1),
    # record numbers: "NHS number 943 476 5919", "hospital no. H-204-118", "insurance ID XJ 4471 9920",
    # "SSN 078-05-1120", "#A-12345"; any run of 7+ digits
    ("identifier", re.compile(r"\b(?:NHS|hospital|medical record|chart|health card|health insurance|insurance|policy|"
                              r"member|SSN|social security|passport|national|admission|accession|unit|registration|"
                              r"ID|identification|MRN|record)\s*(?:number|no\.?|num|#|id|identifier)?\s*[:#]?\s*"
                              r"((?:[A-Z]{1,4}[ -]?)?\d[\d -]{2,}\d[A-Z]?)\b", re.I), 1),
    ("identifier", re.compile(r"\b\d{3}-\d{2}-\d{4}\b"), 0),
    ("identifier", re.compile(r"(?<![\w&])#\s?[A-Z]{0,3}-?\d{4,}\b"), 0),
    ("identifier", re.compile(r"\b[A-Z]{1,4}-\d{3,}(?:-\d+)*\b"), 0),
    ("identifier", re.compile(r"(?<![\w.,])\d{7,}(?![\w.,])"), 0),
    # addresses: street lines (English and continental), flats, postcodes, "from/lives in <Town>"
    ("address", re.compile(r"\b\d{1,5}[A-Za-z]?,?\s+(?:" + _CAP + r"\s+){1,3}" + _STREET + r"\b\.?"), 0),
    ("address", re.compile(r"\b[A-Z\u00c4\u00d6\u00dc][a-z\u00e4\u00f6\u00fc\u00df]+(?:stra\u00dfe|strasse|weg|gasse|platz|allee|laan|straat|gade|vej)"
                           r"\s+\d{1,4}[a-z]?\b"), 0),
    ("address", re.compile(r"\b\d{1,4},?\s+(?i:rue|avenue|boulevard|chemin|place|calle|via|viale|piazza|avenida|rua|carrer)"
                           r"(?:\s+(?:de|du|des|la|le|del|della|da|do|dos|das|di))*\s+[A-Z\u00c0-\u00dd][\w\u00c0-\u00ff'-]+"
                           r"(?:\s+[A-Z\u00c0-\u00dd][\w\u00c0-\u00ff'-]+)*"), 0),
    ("address", re.compile(r"\b(?:Apt|Apartment|Flat|Unit|Suite|Ste|Room|Bed)\.?\s*#?\s*\d+[A-Z]?\b"), 0),
    ("address", re.compile(r"\b[A-Z]{1,2}\d[A-Z\d]?\s+\d[A-Z]{2}\b"), 0),  # UK postcode
    ("address", re.compile(r"\b[A-Z]{2}\s+\d{5}(?:-\d{4})?\b"), 0),  # US state + ZIP
    ("address", re.compile(r"\b(?:from|lives in|living in|lives at|resident of|residing in|resides in|moved to|"
                           r"a native of|native of|born in|works at|works in)\s+(?:the\s+)?(" + _CAPS + r")"), 1),
    # dates in other formats: 1950/01/10, 10-01-1950, 10-Jan-1950, 10 Jan 50, 2021.03.04, "born 1950"
    ("date", re.compile(r"\b\d{4}[/.]\d{1,2}[/.]\d{1,2}\b"), 0),
    ("date", re.compile(r"\b\d{1,2}-\d{1,2}-(?:\d{4}|\d{2})\b"), 0),
    ("date", re.compile(r"\b\d{1,2}[-/ ]" + _MONTHS3 + r"\.?[-/ ]\d{2,4}\b", re.I), 0),
    ("dob", re.compile(r"\b(?:born|b\.|DOB|date of birth|d\.o\.b\.?)\s*(?:in|on|:)?\s*((?:19|20)\d{2})\b(?![-/.]\d)", re.I), 0),
]
"""(kind, pattern, group): the span is the group's text. Dates and record numbers a clinical value could be
mistaken for are kept narrow (a year needs "born"; a digit run seven digits)."""

_PHONE_DIGITS = 7


def free_text_terms(text: str) -> list[tuple[str, str]]:
    """(span, kind) the free-text patterns find in a case's text; a name also as each of its words
    (so a trigger word "whitfield" goes), a surname-first capital form as both its parts."""
    out: list[tuple[str, str]] = []
    for kind, pattern, group in _FREE_TEXT:
        for m in pattern.finditer(text):
            span = m.group(group).strip().rstrip(".,;:")
            if len(span) < 2:
                continue
            if kind == "phone" and sum(c.isdigit() for c in span) < (_PHONE_DIGITS + 2 if span[0] == "0"
                                                                      else _PHONE_DIGITS):
                continue  # (a national number has its trunk 0 and at least 8 more digits)
            if kind == "address" and group and all(w.lower() in _NOT_A_NAME for w in span.split()):
                continue  # "from Monday"
            if kind == "dob" and group == 0:
                span = m.group(1)  # the year; "born" stays
            if kind == "name":
                words = [w for w in re.split(r"[\s,]+", span) if w]
                if all(w.lower() in _NOT_A_NAME or w.lower() in STOPWORDS for w in words):
                    continue
                while words and words[0].lower() in _NOT_A_NAME:  # "Today Eleanor ..." is not all name
                    words = words[1:]
                span = " ".join(words)
                out.append((span, "name"))
                for w in words:
                    out.append((w, "name"))
                    out += [(part, "name") for part in w.split("-") if len(part) >= 2]
                continue
            out.append((span, kind))
    return out


_FIELD_KINDS = {"name": "name", "place": "place", "date": "date", "age": "age", "id": "identifier",
                "contact": "contact"}
"""The field tool's kinds (handlers/field_deidentifier.py `KINDS`) -> placeholder types."""


def field_terms(text: str, uncommon: frozenset[str] | None, rules: int = 1) -> list[tuple[str, str]]:
    """(span, type) of what the field tool finds in a case's text (pattern set 3). A span it only flags as a
    possible name or place (`certain=False`) is kept as vocabulary when every word of it is common, that is
    not in `uncommon` (the case's tokens that fewer than k subjects' cases hold; None: nothing is common);
    a name or place also as each of its words, so a lower-cased trigger word goes too."""
    from grandrounds.handlers import field_deidentifier

    out: list[tuple[str, str]] = []
    for f in field_deidentifier.find(text, rules):
        kind = _FIELD_KINDS[f.kind]
        if not f.certain and kind in ("name", "place"):
            words = [w for w in WORD.findall(f.text.lower()) if len(w) > 1 and w not in STOPWORDS]
            if uncommon is not None and not any(w in uncommon for w in words):
                continue  # an eponym, "COVID": at least k subjects' cases hold it
        out.append((f.text, kind))
        if kind in ("name", "place"):
            out += _word_terms(f.text, kind)
    return out


def _word_terms(span: str, kind: str) -> list[tuple[str, str]]:
    """Each word of a name or place, and each part of a double-barrelled one, as a term of its own."""
    out: list[tuple[str, str]] = []
    for w in re.split(r"[\s,]+", span):
        if len(w) >= 2:
            out.append((w, kind))
            out += [(part, kind) for part in w.split("-") if len(part) >= 2]
    return out


def structured_terms(identifiers: dict | None) -> list[tuple[str, str]]:
    """(text, type) of a case's `identifiers` field (handlers/cases.py `CaseIdentifiers`)."""
    if not identifiers:
        return []
    out: list[tuple[str, str]] = []
    for name in identifiers.get("names", ()):
        out.append((name, "name"))
        out += _word_terms(name, "name")
    for key, kind in (("mrns", "mrn"), ("ids", "identifier"), ("phones", "phone"), ("emails", "email"),
                      ("addresses", "address")):
        out += [(v, kind) for v in identifiers.get(key, ())]
    for key, kind in (("birth_dates", "dob"), ("dates", "date")):
        for v in identifiers.get(key, ()):
            out += [(spelling, kind) for spelling in _dob_spellings(v)]
    return out


def stated_terms(text: str, patterns: int = 1) -> list[tuple[str, str]]:
    """Identifiers the case text itself states: names ("with name Peter Stafford"), MRNs, dates, URLs;
    with pattern set 2 also what `free_text_terms` finds."""
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
    if patterns >= 2:
        out += free_text_terms(text)
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

    def __init__(self, terms: Iterable[tuple[str, str]], allowed_text: str = "",
                 withheld: frozenset[str] = frozenset(), drop_entries: bool = False,
                 refill_triggers: bool = False):
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
        self.withheld = withheld
        """Tokens of the case that fewer than k subjects' cases hold: withheld from memory text (`memory`)."""
        self.drop_entries = drop_entries
        """Drop a list entry (a trigger term) that scrubbing left as nothing but placeholders (pattern set 2)."""
        self.refill_triggers = refill_triggers
        """A trigger scrubbing emptied is refilled from its item's kept words (pattern set 3)."""
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

    def memory(self, s: str) -> str:
        """`text`, then the k-subjects rule: the case's withheld tokens become `WITHHELD`. Memory text only:
        a retrieval query (`text` alone) is the case's own and never stored."""
        s = self.text(s)
        if self.withheld and s:
            s, n = gate_text(s, self.withheld, _PLACEHOLDER_WORDS)
            if n:
                self.found["withheld"] += n
        return s

    def value(self, v: Any, key: str | None = None) -> Any:
        if key in _KEEP:
            return v
        if isinstance(v, str):
            return self.memory(v)
        if isinstance(v, list):
            out = [self.value(x) for x in v]
            if self.drop_entries:
                # A list entry that was nothing but identifiers or withheld words (a trigger term "eleanor")
                # is dropped, not kept as a placeholder: a trigger is matched word by word against the next
                # case, which "[NAME]" or "[...]" never matches; they would only dilute its overlap.
                out = [x for x, y in zip(out, v)
                       if not (isinstance(y, str) and x != y and _PLACEHOLDERS_ONLY.fullmatch(x))]
            return out
        if isinstance(v, dict):
            out = {k: self.value(x, k) for k, x in v.items()}
            if self.refill_triggers:
                for k in _TRIGGER_KEYS & out.keys():
                    if v[k] and not out[k]:
                        out[k] = self._refilled(out)
            return out
        return v

    def _refilled(self, scrubbed: dict) -> list[str]:
        """A trigger for an item whose every trigger term was an identifier: the key terms (handlers/text.py
        `key_terms`) of the item's own scrubbed text, placeholders left out. Only words scrubbing kept can
        appear, so nothing withheld comes back; an item with no kept words keeps an empty trigger."""
        texts = [x for k, x in scrubbed.items() if k not in _KEEP and k not in _TRIGGER_KEYS and isinstance(x, str)]
        return key_terms(_PLACEHOLDER_RE.sub(" ", " ".join(texts)))


class Deidentifier:
    """Scrubs the memory events a run's writer emits; one per run (`EventWriter.deidentifier`).

    Knows each case from its `case.received` event (seen as it is emitted, or read back from the
    log when a case resumes in a new process) and its patient from the environment's directory.
    """

    def __init__(self, store, run_id: str, directory: Callable[[], PatientDirectory | None] = lambda: None,
                 min_subjects: int = 1, patterns: int = 2):
        self.store = store
        self.run_id = run_id
        self.directory = directory
        self.patterns = patterns
        """The pattern set (`deidentify_patterns` of the policy config): 2 adds `free_text_terms`."""
        self.counts = SubjectCounts(min_subjects)
        """The k-subjects fold (`memory_min_subjects`); k = 1 withholds nothing."""
        self._counts_loaded = min_subjects == 1
        self._index: dict[str, int] = {}
        self._cases: dict[str, dict] = {}
        self._scrubbers: dict[str, SubjectScrubber] = {}
        self.found: Counter[str] = Counter()
        """Placeholders written so far, by type (reported by `grandrounds run --json` as `deidentified`)."""

    def configure(self, min_subjects: int, patterns: int) -> None:
        """Set the run's privacy fields on a de-identifier made before the run's policy was known (the lag
        pass's scratch writer); nothing scrubbed yet, so nothing to redo."""
        if (self.counts.k, self.patterns) == (min_subjects, patterns):
            return
        assert not self._scrubbers, "configure a de-identifier before it scrubs"
        self.patterns = patterns
        self.counts = SubjectCounts(min_subjects)
        self._counts_loaded = min_subjects == 1
        for cid, case in self._cases.items():
            if cid in self._index:
                self.counts.add(case, self._index[cid])

    def observe(self, payload: EventPayload, case_id: str | None) -> None:
        if isinstance(payload, CaseReceived) and case_id is not None:
            self._cases[case_id] = payload.case
            self._index[case_id] = payload.index
            self.counts.add(payload.case, payload.index)
            if len(self._cases) > 256:  # the cases in flight (a policy that writes no memory never trims below)
                oldest = next(iter(self._cases))
                del self._cases[oldest]
                self._index.pop(oldest, None)

    def forget(self, case_id: str | None) -> None:
        """Drop the case's scrubber: one built before its `case.received` was observed (a recall that
        previews retrieval, streams/session.py) knows none of its identifiers and must not be reused."""
        self._scrubbers.pop(case_id or "", None)

    def scrubber(self, case_id: str | None) -> SubjectScrubber:
        key = case_id or ""
        found = self._scrubbers.get(key)
        if found is not None:
            return found
        case = self._cases.get(key) if case_id else None
        index = self._index.get(key)
        if case is None and case_id is not None:
            recorded = self.store.read(self.run_id, types=["case.received"], case_id=case_id)
            if recorded:
                received = recorded[0].decode()
                case, index = received.case, received.index
        terms: list[tuple[str, str]] = []
        allowed = ""
        withheld: frozenset[str] = frozenset()
        if case:
            terms += structured_terms(case.get("identifiers"))
            uncommon = None
            if index is not None:
                self._load_counts()
                uncommon = self.counts.withheld(case, index)
            if self.patterns >= 3:  # the field tool's spans; the k evidence for what it cannot place only
                terms += field_terms(case_text(case), uncommon, rules_version(self.patterns))
            elif uncommon is not None:
                withheld = uncommon
            mrn = case.get("eval_mrn") or case.get("subject")
            if mrn:
                terms.append((str(mrn), "mrn"))
                lookup = self.directory()
                resource = lookup(str(mrn)) if lookup is not None else None
                if resource:
                    terms += patient_terms(resource)
            stated = stated_terms(case_text(case), self.patterns)
            if self.patterns >= 4:  # "born in Brazil": a country or US state is no identifier (rules 2)
                stated = [(t, k) for t, k in stated if not (k in ("address", "place") and is_large_place(t))]
            terms += stated
            allowed = " | ".join(str(v) for v in (case.get("options") or {}).values())
        found = self._scrubbers[key] = SubjectScrubber(terms, allowed, withheld, drop_entries=self.patterns >= 2,
                                                         refill_triggers=self.patterns >= 3)
        if len(self._scrubbers) > 256:  # a long run: keep the recent cases only
            self._scrubbers.pop(next(iter(self._scrubbers)))
            popped = next(iter(self._cases), None)
            if popped is not None:
                del self._cases[popped]
                self._index.pop(popped, None)
        return found

    def _load_counts(self) -> None:
        """Fold the log's `case.received` events into the k-subjects counts, once per process: a run
        resumed (or a case re-executed) in a new process reads the same counts the live fold had, since
        each case's count is read as of its own index (`SubjectCounts`), and folding is idempotent."""
        if self._counts_loaded:
            return
        self._counts_loaded = True
        for e in self.store.read(self.run_id, types=["case.received"]):
            received = e.decode()
            self.counts.add(received.case, received.index)

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
