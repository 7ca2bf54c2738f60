"""De-identification memoises its entity scan per string, whatever case's options it is scrubbed for
(handlers/deidentify.py `_identifying_spans`): the options only decide which first-name pairs pass as
eponyms. The memoised spans must be exactly what `find_entities` reports for that case, in its order,
however warm the memo is with other cases' options; and a string is scanned once."""

from __future__ import annotations

import pytest

from grandrounds.handlers import deidentify
from grandrounds.handlers.policies.selsm import entity_check as ec

from test_entity_gates import SAMPLES

TEXTS = SAMPLES + [
    "Charles Bonnet syndrome in John Carter, seen by Dr Who on 2021-03-04; John Carter again.",
    "James Lind trial; Mary Mallon; [NAME] and [MRN] already written; Anna Smith named Anna.",
    "no entities at all here",
]
ALLOWED = ["", "Charles Bonnet syndrome", "Charles Bonnet syndrome | John Carter", "mary mallon | JAMES LIND"]


def _expected(text: str, allowed: str) -> list[tuple[str, str]]:
    return [(v.category, v.match) for v in ec.find_entities(text, allowed_text=allowed)
            if v.category != "instance-number" and not deidentify._PLACEHOLDER_RE.fullmatch(v.match)]


@pytest.mark.parametrize("text", TEXTS)
def test_memoised_spans_are_find_entities_for_every_case(text):
    deidentify._SPANS.clear()
    for allowed in ALLOWED + ALLOWED[::-1]:  # cold, then warm with every other case's options
        assert deidentify._identifying_spans(text, allowed.lower()) == _expected(text, allowed)


def test_a_string_is_scanned_once_across_cases(monkeypatch):
    deidentify._SPANS.clear()
    calls = []
    real = deidentify.entity_candidates
    monkeypatch.setattr(deidentify, "entity_candidates", lambda s: calls.append(s) or real(s))
    text = "Charles Bonnet syndrome in John Carter"
    out = [deidentify.SubjectScrubber([], allowed).text(text) for allowed in ALLOWED]
    assert calls == [text]
    assert out == ["[NAME] syndrome in [NAME]", "Charles Bonnet syndrome in [NAME]",
                   "Charles Bonnet syndrome in John Carter", "[NAME] syndrome in [NAME]"]
