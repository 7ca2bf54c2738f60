"""find_entities skips a pattern when its text lacks what the pattern cannot match without
(`_NEEDS`): the gates must never hide a span. Each gate is checked against its pattern on texts
that lack the gate's character (the pattern never matches there), and find_entities with the gates
is compared with every pattern scanned, on texts that hit every category."""

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


def _scan_all(monkeypatch, text, **kw):
    monkeypatch.setattr(ec, "_present", lambda _t: {k: True for k in ec.GATES})
    try:
        return ec.find_entities(text, **kw)
    finally:
        monkeypatch.undo()


def test_every_pattern_has_a_gate_entry():
    assert len(ec._NEEDS) == len(ec._PATTERNS)


@pytest.mark.parametrize("text", SAMPLES)
def test_gated_scan_finds_what_the_full_scan_finds(monkeypatch, text):
    gated = ec.find_entities(text, instance_text="45 12345 1950", allowed_text="Charles Bonnet syndrome")
    full = _scan_all(monkeypatch, text, instance_text="45 12345 1950", allowed_text="Charles Bonnet syndrome")
    assert gated == full and gated  # every sample holds something


_REMOVE = {"://": lambda s: s.replace("://", ":/"), "@": lambda s: s.replace("@", " at "),
           ".": lambda s: s.replace(".", " "), "/": lambda s: s.replace("/", " "), "-": lambda s: s.replace("-", " "),
           "digit": lambda s: "".join("x" if c.isdigit() else c for c in s), "upper": lambda s: s.lower(),
           "www.": lambda s: s.replace(".", " "), "tld": lambda s: s.replace(".", " "),
           "localhost|digit": lambda s: re.sub("(?i)localhost", "local host", _REMOVE["digit"](s)),
           "mrn": lambda s: re.sub("(?i)mrn", "m rn", s), "honorific": lambda s: s.lower(),
           "name-word": lambda s: s.replace("name", "nam e").replace("called", "cal led")}


def test_no_pattern_matches_a_text_without_what_its_gate_names():
    rng = random.Random(0)
    alphabet = "abcxyzMRNSDPJ0123456789 .-/:@#=,()+'_\n"
    words = ["localhost", "LocalHost", "www.", "WWW.", ".com", ".ORG", ".nhs.uk", ".health", ".io", "MRN", "mrn",
             "Mr", "Mrs", "Ms", "Miss", "Mx", "Dr", "Prof", "named", "called", "name is", "name:"]
    texts = SAMPLES + [" ".join(rng.choice(words + ["x1", "Ann", "a.b", "12.3.4.5", "5"]) for _ in range(6))
                       for _ in range(300)] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(5, 80))) for _ in range(400)]
    for (category, pattern), needs in zip(ec._PATTERNS, ec._NEEDS):
        if needs is None:
            continue
        for t in texts:
            stripped = _REMOVE[needs](t)
            assert not ec._present(stripped)[needs]
            assert pattern.search(stripped) is None, (category, pattern.pattern, stripped)


def test_literal_gates_keep_every_span_on_texts_that_hold_the_literals(monkeypatch):
    """The literal gates (www., a top-level domain, an honorific, name/called, MRN, localhost) against the
    full scan, on texts mixing those literals with what the patterns match around them."""
    rng = random.Random(1)
    words = ["localhost:8080/x", "LocalHost", "www.a.org", "WWW.X", "b.com/y", "c.ORG", "nhs.uk", "d.health",
             "e.io", "MRN: 12345", "mrn#A99", "Mr Smith", "Mrs. Jones", "Ms Ann", "Miss Kay", "Dr Who", "Prof. X",
             "named Peter", "called Anna", "name is Bob", "name: Eve", "10.0.0.1", "5", "John Carter", "fever."]
    for _ in range(300):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
        assert ec.find_entities(text) == _scan_all(monkeypatch, text), text
