"""Identifiers written into a case's free text never cross patients (issue 32, item 6).

The authored stream tests/fixtures/freetext_identifiers.jsonl (34 MCQ vignettes, 14 patients, three with
four cases each) states each patient in the text the way clinical notes do: names without an honorific,
international phone numbers, several date formats, street addresses, record numbers. Each memory policy
runs it with the sim backbone; every event of every case is searched for the identifiers of the other
patients (tests/freetext_leaks.py). The same count with the rule off shows what the test catches.
"""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from freetext_leaks import FIXTURE, FIXTURE_2, FIXTURE_3, POLICIES, count_hits, run_policy
from grandrounds.cli import main
from grandrounds.handlers.cases import Case
from grandrounds.handlers.deidentify import (_PLACEHOLDERS_ONLY, PLACEHOLDERS, SubjectScrubber, free_text_terms,
                                             stated_terms, structured_terms)
from grandrounds.handlers.policies.config import policy_from_dict, policy_record
from grandrounds.handlers.policies.registry import config_class
from grandrounds.handlers.subject_gate import WITHHELD, SubjectCounts, case_subject, gate_text
from grandrounds.store.eventstore import EventStore

VIGNETTE = ("Eleanor Vasquez-Whitfield, a 40-year-old man (MRN 48213570, DOB 1950-01-10) from Millbrook Falls, "
            "seen on 10-Jan-2021; phone (555) 0100-7000, mobile +44 20 7946 0958, home 07700 900123. Lives at "
            "14 Harbour View Road, Flat 3, SW1A 1AA. NHS number 943 476 5919. Her husband, Tomas Okafor, is here. "
            "Erythrocyte sedimentation rate is 96 mm/h, a positive Kernig sign, blood pressure 120/80.")


# --- the stream: 0 identifiers across patients, each policy --------------------------------------


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_identifier_of_one_patient_reaches_another_patients_events(policy, tmp_path):
    out, found = run_policy(policy, tmp_path / "run.duckdb")
    assert out["cases"] == 34
    assert found["hits"] == 0, found["examples"]
    # the writes did hold identifiers of one patient: now placeholders (the field tool's, issue 41: no `[...]`)
    assert out["deidentified"].get("[NAME]", 0) > 0 and out["deidentified"].get("[CONTACT]", 0) > 0, out
    assert WITHHELD not in out["deidentified"], out


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_identifier_of_the_second_stream_reaches_another_patients_events(policy, tmp_path):
    """Names that are English words, relatives and clinicians, places in Welsh and Swedish, ages over 89."""
    out, found = run_policy(policy, tmp_path / "run.duckdb", cases=FIXTURE_2)
    assert out["cases"] == 10
    assert found["hits"] == 0, found["examples"]
    assert out["deidentified"].get("[AGE 90+]", 0) > 0 or policy in ("none", "long-context"), out
    # a stored trigger is never placeholders only, and a rule's never empty (issue 41, part 3)
    with EventStore(str(tmp_path / "run.duckdb"), read_only=True) as store:
        events = store.read(out["run_id"])
    triggers = [(e, t) for e in events for t in _triggers(_payload(e))]
    for e, t in triggers:
        assert not t or any(not _PLACEHOLDERS_ONLY.fullmatch(x) for x in t), (e.type, t)
    rules = [t for e, t in triggers if e.type in ("rule.added", "rule.edited")]
    assert all(rules), rules
    assert triggers or policy in ("none", "long-context")
    if policy == "evo-medagent":  # what a later case saw, in `audit explain`: the placeholders as stored
        last = [e.case_id for e in events if e.type == "case.completed"][-1]
        res = CliRunner().invoke(main, ["audit", "explain", "--db", str(tmp_path / "run.duckdb"), out["run_id"], last,
                                        "--json"])
        assert res.exit_code == 0, res.output
        assert "[NAME]" in res.output and WITHHELD not in res.output, res.output[:2000]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_identifier_of_the_held_out_stream_reaches_another_patients_events(policy, tmp_path):
    """The stream authored blind (tests/fixtures/HELDOUT.md): double surnames, Chinese characters, handles,
    health-card numbers, counties, ages over 89 in words and after a name that is an ordinary word."""
    out, found = run_policy(policy, tmp_path / "run.duckdb", cases=FIXTURE_3)
    assert out["cases"] == 16
    assert found["hits"] == 0, found["examples"]


def _payload(e) -> dict:
    return e.decode().model_dump(mode="json")


def _triggers(v):
    """Every `trigger` list anywhere in a payload."""
    if isinstance(v, dict):
        for k, x in v.items():
            if k == "trigger" and isinstance(x, list):
                yield x
            else:
                yield from _triggers(x)
    elif isinstance(v, list):
        for x in v:
            yield from _triggers(x)


def test_the_earlier_pattern_set_still_keeps_the_stream_apart(tmp_path):
    """Runs recorded before issue 41 (pattern set 2, the k-subjects rule on every word) re-execute with it."""
    out, found = run_policy("evo-medagent", tmp_path / "v2.duckdb", extra="deidentify_patterns = 2\n")
    assert found["hits"] == 0, found["examples"]
    assert out["deidentified"].get(WITHHELD, 0) > 0, out


def test_without_the_rule_the_same_stream_leaks(tmp_path):
    """The measurement can fail: with the rule off and the earlier pattern set (the behaviour the issue
    reported), names, towns and phones of one patient reach other patients' cases."""
    out, found = run_policy("evo-medagent", tmp_path / "off.duckdb", off=True)
    assert found["hits"] > 50 and found["pairs"] >= 20, found
    assert found["by_place"].get("other-case", 0) > 0


def test_a_run_under_the_rule_re_executes_to_its_fingerprint(tmp_path):
    """The counts are rebuilt from the log (`case.received`, in case order): verify's re-execution, in a
    fresh store, withholds the same words and ends at the same fingerprint."""
    db = tmp_path / "run.duckdb"
    out, _ = run_policy("evo-medagent", db)
    res = CliRunner().invoke(main, ["verify", "--db", str(db), out["run_id"], "--json"])
    ver = json.loads(res.stdout)
    assert ver["identical"] and ver["fingerprint"] == out["fingerprint"], ver
    with EventStore(str(db), read_only=True) as s:
        started = s.read(out["run_id"], upto_seq=0)[0].payload
    assert started["policy"]["memory_min_subjects"] == 3 and started["policy"]["deidentify_patterns"] == 4
    tool = started["code"]["deidentifier"]  # the field tool's settings (issue 41), as verify compares them
    assert tool["tool"] == "philter-lite" and tool["tool_version"] == "0.6.0" and len(tool["config_digest"]) == 64


# --- the k-subjects fold ------------------------------------------------------------------------


def _cases() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


def test_a_word_passes_only_at_k_distinct_subjects():
    counts = SubjectCounts(3)
    a1 = {"case_id": "1", "subject": "A", "question": "Zorblat and fever", "options": {"A": "x", "B": "y"}}
    a2 = {"case_id": "2", "subject": "A", "question": "Zorblat again, fever"}
    b = {"case_id": "3", "subject": "B", "question": "zorblat, fever"}
    c = {"case_id": "4", "question": "ZORBLAT fever"}  # no subject: the case is its own
    for i, case in enumerate([a1, a2, b, c]):
        counts.add(case, i)
    # one patient's many cases are one subject: at case 2 (index 2) only A and B hold it
    assert counts.subjects("zorblat", 1) == 1 and counts.subjects("zorblat", 2) == 2
    assert "zorblat" in counts.withheld(b, 2) and "zorblat" not in counts.withheld(c, 3)
    # option texts, stopwords and one-letter tokens are never withheld
    assert counts.withheld(a1, 0) == {"zorblat", "fever"}
    assert case_subject(c) == "case:4" and case_subject({"eval_mrn": "S1", "case_id": "x"}) == "subject:S1"


def test_the_fold_is_a_function_of_the_cases_not_of_their_arrival():
    """Live, a case's count is read when it is received; resumed, the log is folded again (twice over
    what the live process already holds, and in any order): each case's withheld words are the same."""
    cases = _cases()
    live = SubjectCounts(3)
    expected = []
    for i, case in enumerate(cases):
        live.add(case, i)
        expected.append(live.withheld(case, i))
    again = SubjectCounts(3)
    shuffled = list(enumerate(cases))
    random.Random(7).shuffle(shuffled)
    for i, case in shuffled + shuffled:
        again.add(case, i)
    assert [again.withheld(c, i) for i, c in enumerate(cases)] == expected
    last = max(i for i, c in enumerate(cases) if c["subject"] == "P01")
    assert "eleanor" in expected[last]  # P01's four cases: still one subject at their last
    assert "claudication" in expected[0] and "claudication" not in expected[last]  # a finding others share passes


def test_withheld_words_become_one_marker_and_placeholders_stay():
    text, n = gate_text("When a case presents with eleanor, vasquez, whitfield, millbrook, falls: [NAME] fever",
                        frozenset({"eleanor", "vasquez", "whitfield", "millbrook", "name"}), frozenset({"NAME"}))
    assert text == f"When a case presents with {WITHHELD}, falls: [NAME] fever" and n == 4


def test_a_trigger_term_that_was_only_an_identifier_is_dropped():
    s = SubjectScrubber([("Eleanor", "name")], withheld=frozenset({"millbrook"}), drop_entries=True)
    assert s.value({"trigger": ["eleanor", "millbrook", "fever"], "text": "eleanor of millbrook"}) == {
        "trigger": ["fever"], "text": f"[NAME] of {WITHHELD}"}


def test_a_trigger_scrubbing_empties_is_refilled_from_the_items_kept_words():
    s = SubjectScrubber([("Eleanor Whitfield", "name"), ("Eleanor", "name"), ("Whitfield", "name"), ("Millbrook", "place")],
                        drop_entries=True, refill_triggers=True)
    rule = {"rule_id": "r1", "text": "Eleanor Whitfield of Millbrook: think of giant cell arteritis when jaw "
                                     "claudication follows headache", "trigger": ["eleanor", "whitfield", "millbrook"]}
    out = s.value(rule)
    assert out["trigger"][:4] == ["think", "giant", "cell", "arteritis"] and "claudication" in out["trigger"]
    assert not {"eleanor", "whitfield", "millbrook", "name", "place"} & set(out["trigger"])
    # nested items (a skill's body, a lesson in a list) too; a trigger with a kept term, or empty, stays
    nested = s.value({"body": {**rule, "trigger": ["eleanor"]}, "lessons": [{"text": "Millbrook", "trigger": ["millbrook"]}]})
    assert nested["body"]["trigger"] == out["trigger"] and nested["lessons"][0]["trigger"] == []
    assert s.value({**rule, "trigger": ["eleanor", "claudication"]})["trigger"] == ["claudication"]
    assert s.value({**rule, "trigger": []})["trigger"] == []
    # pattern set 2 (runs recorded with it) keeps its empty trigger
    assert SubjectScrubber([("Eleanor", "name")], drop_entries=True).value({"text": "fever", "trigger": ["eleanor"]}) == {
        "text": "fever", "trigger": []}


# --- patterns and structured identifiers -----------------------------------------------------------


def test_free_text_patterns_find_what_a_vignette_states():
    found = {(t.lower(), k) for t, k in free_text_terms(VIGNETTE)}
    for term, kind in [("eleanor vasquez-whitfield", "name"), ("whitfield", "name"), ("tomas okafor", "name"),
                       ("okafor", "name"), ("(555) 0100-7000", "phone"), ("+44 20 7946 0958", "phone"),
                       ("07700 900123", "phone"), ("14 harbour view road", "address"), ("sw1a 1aa", "address"),
                       ("millbrook falls", "address"), ("flat 3", "address"), ("943 476 5919", "identifier"),
                       ("10-jan-2021", "date")]:
        assert (term, kind) in found, (term, kind)
    spans = " | ".join(t for t, _ in free_text_terms(VIGNETTE))
    for clinical in ("96 mm/h", "Kernig", "120/80", "Erythrocyte"):
        assert clinical not in spans
    # the earlier pattern set stays as it was (runs recorded with it re-execute alike)
    assert not any(k == "phone" and "0100" in t for t, k in stated_terms(VIGNETTE, patterns=1))
    assert ("(555) 0100-7000", "phone") in stated_terms(VIGNETTE, patterns=2)


def test_a_scrubbed_vignette_keeps_no_identifier():
    out = SubjectScrubber(stated_terms(VIGNETTE, patterns=2)).text(VIGNETTE).lower()
    for ident in ("eleanor", "vasquez", "whitfield", "millbrook", "0100-7000", "7946", "900123", "harbour view",
                  "sw1a", "5919", "okafor", "48213570", "1950-01-10"):
        assert ident not in out, (ident, out)
    assert "96 mm/h" in out and "kernig sign" in out


def test_structured_identifiers_are_validated_and_scrubbed_exactly():
    base = {"case_id": "c1", "kind": "mcq", "question": "q", "options": {"A": "a", "B": "b"}, "answer": "A"}
    case = Case.model_validate({**base, "identifiers": {"names": ["Solveig Brekkestad-Moe"], "birth_dates": ["1950-01-10"],
                                                        "phones": ["+47 22 12 34 56"]}})
    assert "identifiers" not in Case.model_validate(base).model_dump()  # unset: the case keeps its bytes
    with pytest.raises(ValidationError):
        Case.model_validate({**base, "identifiers": {"nicknames": ["Sol"]}})
    with pytest.raises(ValidationError):
        Case.model_validate({**base, "identifiers": {"names": [" "]}})
    s = SubjectScrubber(structured_terms(case.model_dump()["identifiers"]))
    out = s.text("brekkestad said Solveig Brekkestad-Moe (born 10.01.1950, January 10, 1950) rang +47 22 12 34 56")
    assert out == "[NAME] said [NAME] (born [DOB], [DOB]) rang [PHONE]", out


def test_the_rule_is_in_the_recorded_config_and_off_for_runs_recorded_before_it():
    cls = config_class("evo-medagent")
    assert cls().memory_min_subjects == 3 and policy_record(cls())["memory_min_subjects"] == 3
    old = policy_from_dict({"name": "evo-medagent"}, recorded=True)
    assert old.memory_min_subjects == 1 and old.deidentify_patterns == 1
    assert PLACEHOLDERS["withheld"] == WITHHELD
