"""find_entities skips a pattern when the text lacks what the pattern cannot match without
(`_gates`: a literal, enough of one, enough digits, a capital): the gates must never hide a span.
Each closed gate is checked against its pattern on texts built around every gate's threshold (the
pattern never matches there, or for instance numbers never yields a reportable one), and
find_entities with the gates is compared with every pattern scanned."""

from __future__ import annotations

import random
import re

import pytest

from grandrounds.handlers.policies.selsm import entity_check as ec

SAMPLES = [
    "Mr. Smith, MRN S6534835, seen 2023-04-05T10:22:00Z at http://localhost:8080/fhir/Patient/123.",
    "Call (555) 123-4567 or mail jane.doe@example.org; www.example.com/x; host 10.0.0.1:80/a.",
    "Patient ID: A12345, order # 998877, encounter-id 42, born 3rd of March, 1950 (March 3, 1950).",
    "A 45-year-old named Peter with fever; 12/03/2020; Charles Bonnet syndrome; John Carter.",
    "uuid 123e4567-e89b-12d3-a456-426614174000; Observation/abc-1; localhost; Dr Who; mar 2021",
    "no digits, no capitals: fever and cough after travel; see localhost and example.com",
    "NHS site nhs.uk/health, 1,234,567 cells, 0.5 mg; the patient is called Anna.",
]

_OPEN = [True] * (len(ec._PATTERNS) + 1)


def _scan_all(monkeypatch, text, **kw):
    """find_entities with every pattern scanned: the reference the gates must agree with."""
    monkeypatch.setattr(ec, "_gates", lambda *_a, **_k: list(_OPEN))
    try:
        return ec.find_entities(text, **kw)
    finally:
        monkeypatch.undo()


# Fragments around every gate's threshold: a digit short of each count, one `-`, `.` or `/` short, the
# case-insensitive literals in any case, and non-ASCII letters a regex folds onto ASCII ones under
# IGNORECASE (ſ ~ s, ı and İ ~ i, the Kelvin sign ~ k) where lower() does not.
_FRAGMENTS = [
    "localhost", "LocalHost:8080/x", "localhoſt", "LOCALHOST", "10.0.0.1", "1.2.3", "1.2.3.4", "12.3.4.5:80/a",
    "www.a.org", "WWW.X", "b.com/y", "c.ORG", "nhs.uk", "ex.nhſ.uk", "d.health", "e.io", "abc.İo", "ab.ıo",
    "123e4567-e89b-12d3-a456-426614174000", "abcdefab-abcd-abcd-abcd-abcdefabcdef", "a-b-c-d", "a-b-c-d-e",
    "MRN: 12345", "mrn#A99", "MRN", "S6534835", "AB1234", "ABC12345", "X1234", "Patient ID: A12345",
    "order # 998877", "case no. 7", "specimen-id 42", "ſubject id 3", "viſit 9", "record number 12",
    "(555) 123-4567", "+1 555 123 4567", "555-123-456", "060-415-5872", "555 123 4567",
    "2023-04-05", "2023-4-5", "2023-4-5T10:22", "202-4-5", "12/03/2020", "1.2.20", "12/3", "1/2/3",
    "March 3", "3rd of March", "mar 2021", "Sept. 12th, 2020", "ſep 2020", "Dec 5", "5 jan", "MAY 12",
    "Mr Smith", "Mrs. Jones", "Dr Who", "Prof. X", "named Peter", "called Anna", "name is Bob", "name: Eve",
    "Observation/abc-1", "Patient/", "a@b.co", "http://x", "ftp://y", "12,345", "1,234", "45", "99999",
    "1234", "12345", "0.5", "John Carter", "Charles Bonnet syndrome", "fever.", "cough", "case", "the",
    "\u212aelvin", "İ", "Ωmega",
]


def _texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    seps = [" ", "", "-", ".", "/", ", ", ": ", "\n"]
    out = list(SAMPLES)
    for _ in range(n):
        parts = [rng.choice(_FRAGMENTS) if rng.random() < 0.7 else str(rng.randint(0, 10 ** rng.randint(1, 11)))
                 for _ in range(rng.randint(1, 6))]
        text = parts[0]
        for part in parts[1:]:
            text += rng.choice(seps) + part
        out.append(text)
    alphabet = "abcxyzMRNSDPJ0123456789 .-/:@#=,()+'_\nſı"
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randint(5, 80))) for _ in range(n // 2)]
    return out


def _reportable(category: str, pattern: re.Pattern, text: str, instance_numbers) -> bool:
    """Whether `pattern` alone yields a span entity_candidates could keep (instance numbers filtered as there)."""
    for m in pattern.finditer(text):
        span = m.group(0).rstrip(".,;:)")
        if not span:
            continue
        if category != "instance-number":
            return True
        digits = span.replace(",", "")
        if len(digits) >= ec.LONG_DIGITS or (len(digits) >= 2 and digits in instance_numbers):
            return True
    return False


def test_one_gate_per_pattern_and_one_for_name_pairs():
    assert len(ec._gates("x")) == len(ec._PATTERNS) + 1


@pytest.mark.parametrize("text", SAMPLES)
def test_gated_scan_finds_what_the_full_scan_finds(monkeypatch, text):
    gated = ec.find_entities(text, instance_text="45 12345 1950", allowed_text="Charles Bonnet syndrome")
    full = _scan_all(monkeypatch, text, instance_text="45 12345 1950", allowed_text="Charles Bonnet syndrome")
    assert gated == full and gated  # every sample holds something


@pytest.mark.parametrize("instance_numbers", [frozenset(), frozenset({"45", "12", "1234", "99"})])
def test_no_closed_gate_hides_a_match(instance_numbers):
    """Each gate against its own pattern: where `_gates` says a pattern cannot yield a span, it yields none."""
    closed = 0
    for text in _texts(0, 1500):
        gates = ec._gates(text, instance_numbers)
        for (category, pattern), may in zip(ec._PATTERNS, gates):
            if not may:
                closed += 1
                assert not _reportable(category, pattern, text, instance_numbers), (category, pattern.pattern, text)
        if not gates[-1]:
            assert ec._CAPITALISED_PAIR.search(text) is None, text
    assert closed > 10_000  # the gates did close on these texts (the check is not vacuous)


def test_gated_scan_equals_the_full_scan_on_varied_texts(monkeypatch):
    for i, text in enumerate(_texts(1, 800)):
        instance = "45 12 1234 99" if i % 2 else ""
        kw = {"instance_text": instance, "allowed_text": "Charles Bonnet syndrome" if i % 3 else ""}
        assert ec.find_entities(text, **kw) == _scan_all(monkeypatch, text, **kw), text


@pytest.mark.parametrize("text", ["see localhoſt now", "site abc.İo here", "ab.ıo", "ex.nhſ.uk", "ſubject id 3",
                                  "ſep 12", "ex.nhs.u\u212a"])
def test_case_folded_non_ascii_literals_are_not_gated_out(monkeypatch, text):
    """Under IGNORECASE `localhoſt` is `localhost` to the regex but not to `in text.lower()`: such texts
    keep the case-insensitive gates open."""
    assert ec.find_entities(text) == _scan_all(monkeypatch, text)
    assert ec.find_entities(text)  # each holds a span the full scan finds
