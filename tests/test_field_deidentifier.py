"""The field de-identifier (handlers/field_deidentifier.py): philter-lite as pinned, without NLTK's data,
plus the Safe Harbor rules it lacks (ages over 89, phones and record numbers their context names, the year of
a date kept), typed; pure and memoised by settings and text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grandrounds.handlers import field_deidentifier as fd
from grandrounds.store.machine_cache import MachineSpanCache, span_cache

ROOT = Path(__file__).resolve().parents[1]


def kinds(text: str) -> list[tuple[str, str]]:
    return [(f.text, f.kind) for f in fd.find(text)]


def test_names_places_and_contacts_are_found_and_typed():
    text = ("A 34-year-old woman, Mrs Rose Baker of Little Snoring, presents with polyuria, polydipsia and a "
            "fruity odour on the breath. Email rose.baker@example.org.")
    out = fd.redact(text)
    assert out == ("A 34-year-old woman, Mrs [NAME] of [PLACE], presents with polyuria, polydipsia and a "
                   "fruity odour on the breath. Email [CONTACT].")


def test_ages_over_89_become_90_or_older_and_younger_ages_stay():
    assert fd.redact("She is aged 93 and her husband is 71.") == "She is aged [AGE 90+] and her husband is 71."
    assert fd.redact("A 93-year-old man with chest pain") == "A [AGE 90+] man with chest pain"
    assert fd.redact("a 97 yo woman; a nonagenarian") == "a [AGE 90+] woman; a [AGE 90+]"
    assert fd.redact("A 45-year-old man, HR 95, SpO2 92%, Na 135") == "A 45-year-old man, HR 95, SpO2 92%, Na 135"
    assert ("97", "age") in kinds("Seen with Tom Reyes (97) today")


def test_phones_and_record_numbers_in_the_layouts_their_context_names():
    for text, needle in [("phone (555) 0100-7000", "(555) 0100-7000"), ("fax 020 7946 0958", "020 7946 0958"),
                         ("mobile +49 (0)30 1234567", "+49 (0)30 1234567"),
                         ("NHS number 943 476 5919", "943 476 5919"), ("hospital no. H-204-118", "H-204-118"),
                         ("MRN A1234567", "A1234567"), ("SSN 078-05-1120", "078-05-1120")]:
        out = fd.redact(f"Contact details: {text}.")
        assert needle not in out, (text, out)
        assert "[CONTACT]" in out or "[ID]" in out


def test_a_dates_year_is_kept():
    out = fd.redact("Seen on 12 March 2021 and again on 03/04/2022.")
    assert "2021" in out and "2022" in out and "March" not in out and "03/04" not in out
    assert out.count("[DATE]") == 2


def test_clinical_text_is_kept():
    text = ("Blood pressure 120/80 mmHg, heart rate 95, sodium 135 mmol/L, WBC 12.5; given 500 mg amoxicillin "
            "for 7 days. Chest X-ray shows bilateral hilar lymphadenopathy.")
    assert fd.redact(text) == text
    # what the tool reads as a name is flagged, uncertain: the k-subjects evidence keeps it (part 2)
    assert [(f.text, f.certain) for f in fd.find("PCR for COVID-19 negative")] == [("COVID", False)]


def test_an_eponym_is_flagged_but_not_certain():
    """What the catch-all flags (an eponym, a surname) is `certain=False`: the k-subjects evidence decides it
    across patients (issue 41 part 2), not this text alone."""
    found = [f for f in fd.find("polyuria and Kussmaul breathing", rules=1) if f.text == "Kussmaul"]
    assert found and not found[0].certain
    found = [f for f in fd.find("polyuria; the breathing was Kussmaul.") if f.text == "Kussmaul"]
    assert found and not found[0].certain  # rules 2: not before what it names, still flagged
    assert all(f.certain for f in fd.find("aged 93, phone (555) 0100-7000"))


def test_spans_are_ordered_and_do_not_overlap():
    text = ("Eleanor Vasquez-Whitfield, a 40-year-old man from Millbrook Falls, NHS 943 476 5919, seen 12 March "
            "2021 by Dr Okafor; Tom Reyes (97), fax 020 7946 0958.")
    spans = fd.find(text)
    assert all(a.stop <= b.start for a, b in zip(spans, spans[1:]))
    assert all(text[f.start:f.stop] == f.text and f.kind in fd.KINDS for f in spans)
    out = fd.redact(text)
    for needle in ("Eleanor", "Vasquez", "Whitfield", "Millbrook", "943 476", "Okafor", "Reyes", "7946", "March"):
        assert needle not in out, (needle, out)


def test_settings_pin_the_tool_and_digest_the_configuration():
    s = fd.settings()
    assert s["tool"] == "philter-lite" and s["tool_version"] == "0.6.0" == fd.TOOL_VERSION
    assert s["rules_version"] == fd.RULES_VERSION and len(s["config_digest"]) == 64
    assert fd.text_key("x").startswith(s["config_digest"] + ":")


def test_rules_version_1_is_what_runs_recorded_with_it():
    """Pattern set 3 runs re-execute with rules 1: its digest is the one they recorded, its results too."""
    assert fd.settings(1)["config_digest"].startswith("a6bbf4c1afbd8d98")
    assert fd.settings(2)["config_digest"] != fd.settings(1)["config_digest"]
    assert fd.redact("Addison disease after a fall; aged ninety-two", rules=1) == "[NAME] disease after a [DATE]; aged ninety-two"
    with pytest.raises(fd.ToolVersionError):
        fd.settings(3)


@pytest.mark.parametrize("text, out", [
    ("She is aged ninety-two and lives alone", "She is aged [AGE 90+] and lives alone"),
    ("a hundred and one years old", "[AGE 90+]"),
    ("plate KX19 ABC, serial SN-4471-XQ", "plate [ID], serial [ID]"),
    ("@jk_oyelaran posts daily", "[CONTACT] posts daily"),
    ("see www.oyelaran-family.com or oyelaran.org.uk", "see [CONTACT] or [CONTACT]"),
    ("seen Tuesday 14th and on the 3rd of May", "seen [DATE] and on [DATE]"),
    ("admitted on Christmas Eve 2019", "admitted on [DATE] 2019"),
    ("in the fall of 2019 she had a fall", "in the [DATE] 2019 she had a fall"),
])
def test_rules_2_find_more_safe_harbor_items(text, out):
    assert fd.redact(text) == out


@pytest.mark.parametrize("text", [
    "Addison disease and Parkinson disease", "Hodgkin lymphoma with Graves disease", "Raynaud’s phenomenon",
    "Kayser-Fleischer rings in Wilson disease", "Janeway lesions and Roth spots", "Stevens-Johnson syndrome",
    "Forty-eight hours later", "emigrated from Mali, Niger and Chad", "travel to Thailand and India and Brazil",
    "returned from Texas and California", "a fall at home",
])
def test_rules_2_keep_what_is_medicine_or_allowed(text):
    assert fd.redact(text) == text


@pytest.mark.parametrize("text, gone", [
    ("Georgia returns with a cough", "Georgia"),  # a country's name, as a person's: no place cue
    ("Bill Baker has a Baker cyst", "Bill"),
    ("Grace Field was seen with a rash", "Field"),  # "with a rash" follows, not what the name names
    ("Dr Amelia Stone at Windrush Surgery", "Windrush"),
])
def test_rules_2_still_remove_a_name_near_medicine(text, gone):
    assert gone not in fd.redact(text)


def test_the_pinned_tool_is_what_pyproject_declares():
    text = (ROOT / "pyproject.toml").read_text()
    assert f'"philter-lite=={fd.TOOL_VERSION}"' in text
    # rules 2's geography (countries, US states, ISO 3166-2 subdivisions): pinned, its version in the digest
    from importlib import metadata

    assert f'"pycountry=={metadata.version("pycountry")}"' in text


def test_nltk_data_is_never_read(monkeypatch):
    """No tagger model (a pickle NLTK would download) is loaded: the pinned tool's one call goes to our tagger."""
    import nltk

    def refuse(*a, **k):
        raise AssertionError("nltk.pos_tag called")

    monkeypatch.setattr(nltk, "pos_tag", refuse)
    monkeypatch.setattr(nltk.data, "load", refuse)
    assert "[NAME]" in fd.redact("Mrs Henrietta Quillfeather was admitted yesterday with a cough and fever.")


def test_the_result_is_the_same_in_a_fresh_process():
    text = "Eleanor Vasquez-Whitfield (DOB 1950-01-10), phone (555) 0100-7000, aged 93, from Millbrook Falls."
    prog = ("import json, sys\nfrom grandrounds.handlers import field_deidentifier as fd\n"
            "print(json.dumps([fd.redact(sys.argv[1]), fd.settings()]))")
    out = subprocess.run([sys.executable, "-c", prog, text], capture_output=True, text=True, check=True, timeout=300)
    assert json.loads(out.stdout) == [fd.redact(text), fd.settings()]


def test_a_text_is_read_once(monkeypatch):
    calls = []
    real = fd._tool_spans
    monkeypatch.setattr(fd, "_tool_spans", lambda t, rules=fd.RULES_VERSION: calls.append(t) or real(t, rules))
    text = "Mr Bartholomew Ignatius Fennimore-Oduya was seen on 4 June 2020 with haemoptysis."
    monkeypatch.setenv("GRANDROUNDS_EMBEDDING_CACHE", "off")  # the process memo alone
    fd._MEMO.clear()
    first = fd.find(text)
    assert fd.find(text) == first and len(calls) == 1


def _fresh_cache(monkeypatch, folder) -> MachineSpanCache:
    monkeypatch.setenv("GRANDROUNDS_EMBEDDING_CACHE", str(folder))
    fd._MEMO.clear()
    cache = span_cache()
    assert cache is not None and cache.path.parent == folder
    return cache


def test_a_text_is_read_once_a_machine_and_a_warm_process_loads_no_filter(monkeypatch, tmp_path):
    """Another process (a worker, a permutation, the next run) reads the spans back from the machine's
    de-identification cache, keyed by settings and the text's sha256: the tool's filters never load."""
    text = "Mrs Winifred Ashcombe-Lydgate of Little Snoring, aged 93, phone 01632 960 123, seen 4 June 2020."
    cache = _fresh_cache(monkeypatch, tmp_path / "m")
    first = fd.find(text)
    assert cache.writes == 1 and cache.get(fd.text_key(text)) is not None
    prog = ("import json, sys\nfrom grandrounds.handlers import field_deidentifier as fd\n"
            "spans = [[f.start, f.stop, f.kind, f.certain, f.text] for f in fd.find(sys.argv[1])]\n"
            "print(json.dumps([spans, fd._tool.cache_info().currsize]))")
    out = subprocess.run([sys.executable, "-c", prog, text], capture_output=True, text=True, check=True, timeout=300,
                         env={**os.environ, "GRANDROUNDS_EMBEDDING_CACHE": str(tmp_path / "m")})
    spans, loaded = json.loads(out.stdout)
    assert spans == [[f.start, f.stop, f.kind, f.certain, f.text] for f in first] and loaded == 0


@pytest.mark.parametrize("row", ["not json", "{}", '[[0, 9999, "name", false]]', '[[0, 4, "person", false]]',
                                 '[[5, 9, "name", false], [0, 3, "name", true]]', '[[0, 4, "name", 1]]',
                                 '[[0.0, 4, "name", false]]', '[[0, 4, "name"]]'])
def test_a_cache_row_that_is_not_spans_of_the_text_is_recomputed_and_replaced(monkeypatch, tmp_path, row):
    text = "Mr Bartholomew Fennimore was seen on 4 June 2020 with haemoptysis."
    monkeypatch.setenv("GRANDROUNDS_EMBEDDING_CACHE", "off")
    fd._MEMO.clear()
    truth = fd.find(text)
    cache = _fresh_cache(monkeypatch, tmp_path / "m")
    cache.put(fd.text_key(text), row)
    assert fd.find(text) == truth
    assert json.loads(cache.get(fd.text_key(text))) == [[f.start, f.stop, f.kind, f.certain] for f in truth]


def test_a_row_brings_no_words_of_its_own(monkeypatch, tmp_path):
    """A row is offsets into the text: whatever it claims, a span's text is the text's own slice."""
    text = "Seen with haemoptysis."
    cache = _fresh_cache(monkeypatch, tmp_path / "m")
    cache.put(fd.text_key(text), '[[0, 4, "name", true]]')
    assert [(f.text, f.kind) for f in fd.find(text)] == [("Seen", "name")]


@pytest.mark.parametrize("bad", ["", "   ", "\n"])
def test_empty_text_has_nothing_to_find(bad):
    assert fd.find(bad) == () and fd.redact(bad) == bad


@pytest.mark.parametrize("stream", ["freetext_identifiers", "freetext_identifiers_2"])
def test_every_identifier_of_the_authored_phi_streams_leaves_its_case_text(stream):
    """Both authored free-text PHI streams (names that are English words, relatives, employers, GPs, rare and
    non-English places, e-mail, national numbers, written dates, ages over 89, phones in several layouts):
    no identifier of a patient is left in the de-identified text of their case."""
    import re

    fixtures = ROOT / "tests" / "fixtures"
    doc = json.loads((fixtures / f"{stream}.truth.json").read_text(encoding="utf-8"))
    left = []
    for line in (fixtures / f"{stream}.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        out = fd.redact(case["question"])
        for needle in doc["patients"][case["subject"]] + doc.get("ages_over_89", {}).get(case["subject"], []):
            if re.search(r"(?<![^\W_])" + re.escape(needle) + r"(?![^\W_])", out, re.I):
                left.append((case["case_id"], needle))
    assert left == []
