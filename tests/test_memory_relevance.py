"""Memory that helps a small model: relevance floors, precedents, the review gate, the precedent baseline."""

from __future__ import annotations

import json

from fake_openai_server import FakeOpenAI
from grandrounds.handlers.cases import Case
from grandrounds.handlers.policies.config import EvoMedAgentPolicy, load_policy
from grandrounds.handlers.policies.precedents import findings_of, review_text
from grandrounds.handlers.policies.render import render_prefix
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.eventstore import EventStore
from llm_helpers import MODEL, live_options, run

OPTS = {"A": "Aortic dissection", "B": "Acute pericarditis", "C": "Pulmonary embolism"}
CHEST = "Sudden tearing chest pain radiating to the back, unequal arm pressures, widened mediastinum."


def _case(cid: str, question: str, options: dict[str, str], answer: str, category: str = "chest pain") -> Case:
    return Case(case_id=cid, kind="mcq", question=question, options=options, answer=answer, category=category)


DISSECTION_1 = _case("d1", "A hypertensive man has sudden tearing chest pain radiating to the back; arm blood "
                           "pressures differ and the mediastinum is widened.", OPTS, "A")
DISSECTION_2 = _case("d2", "Tearing chest pain radiating to the back with unequal arm blood pressures and a widened "
                           "mediastinum in a hypertensive woman.", {"A": "Acute pericarditis", "B": "Aortic dissection",
                                                                    "C": "Pulmonary embolism"}, "B")
PELVIC = _case("p1", "Ovarian cyst twisted: vomiting, adnexal Doppler absent, tennis, unilateral groin ache.",
               {"A": "Ovarian torsion", "B": "Ectopic pregnancy", "C": "Appendicitis"}, "A", "pelvic pain")


# --- the review gate -----------------------------------------------------------------------------


def test_the_review_gate_keeps_findings_answer_names_letters_and_wrong_options_out():
    q, gold = DISSECTION_1.question, "A"
    assert review_text("Aortic dissection", q, OPTS, gold) == "only the name of option A"
    assert review_text("tearing chest pain radiating to the back", q, OPTS, gold) == "only a finding of this case"
    assert review_text("The correct diagnosis should have been C.", q, OPTS, gold) == "names an option by its letter"
    assert review_text("Favour option B when the pain is positional.", q, OPTS, gold) == "names an option by its letter"
    assert review_text("Tearing pain with unequal arm pressures suggests pulmonary embolism.", q, OPTS, gold) \
        .startswith("teaches option C")
    good = "Tearing pain with unequal arm pressures suggests aortic dissection; image the aorta before anticoagulation."
    assert review_text(good, q, OPTS, gold) is None


def test_findings_drop_the_question_sentence():
    assert findings_of("Fever and neck stiffness. Which of the following is the most likely diagnosis?") == \
        "Fever and neck stiffness."


# --- floors and precedents (sim backbone: no model) -----------------------------------------------


def _sim(store, cases, policy, rid):
    from llm_helpers import HashEmbedder
    from grandrounds.app import run_cases
    from grandrounds.store.embeddings import EmbeddingCache

    # Two or three cases are too few subjects for the k-subjects gate (tests/test_privacy_freetext.py) to pass
    # a word: these tests are about what a precedent shows, so the gate is off (memory_min_subjects=1).
    spec = RunSpec(policy=policy.model_copy(update={"memory_min_subjects": 1}), backbone="sim", seed=0)
    return run_cases(store, cases, spec, run_id=rid, cache=EmbeddingCache(HashEmbedder(), store.conn))


def _retrieved(store, rid):
    return {e.case_id: e.payload for e in store.iter(rid, types=["memory.retrieved"])}


def test_with_nothing_relevant_the_prompt_is_the_memory_free_one():
    with EventStore(":memory:") as store:
        _sim(store, [DISSECTION_1, PELVIC], EvoMedAgentPolicy(), "evo")
        seen = _retrieved(store, "evo")
        _sim(store, [DISSECTION_1, PELVIC], EvoMedAgentPolicy(episode_floor=-1.0, rule_floor=0.0), "nofloor")
        unfloored = _retrieved(store, "nofloor")
    assert seen["p1"]["prefix"] == render_prefix([], [], [])
    assert not seen["p1"]["episodes"] and not seen["p1"]["rules"]
    assert unfloored["p1"]["episodes"]  # without the floor the chest-pain episode was shown to a pelvic case


def test_a_recurring_presentation_sees_its_precedent_with_the_confirmed_answer_text():
    with EventStore(":memory:") as store:
        _sim(store, [DISSECTION_1, DISSECTION_2], EvoMedAgentPolicy(), "evo")
        seen = _retrieved(store, "evo")
        stored = [e.payload for e in store.iter("evo", types=["episode.stored"])]
    prefix = seen["d2"]["prefix"]
    assert seen["d2"]["episodes"] and "Confirmed answer: Aortic dissection" in prefix
    assert "Past case: A hypertensive man has sudden tearing chest pain" in prefix
    assert stored[0]["gold_text"] == "Aortic dissection" and stored[0]["answer_text"]


def test_the_precedent_baseline_stores_cases_without_a_model_and_shows_the_nearest():
    with EventStore(":memory:") as store:
        out = _sim(store, [DISSECTION_1, PELVIC, DISSECTION_2], load_policy("precedent"), "prec")
        seen = _retrieved(store, "prec")
        types = [e.type for e in store.iter("prec")]
    assert out.summary["memory"]["episodes"] == 3 and "reflection.recorded" not in types
    assert seen["p1"]["prefix"] == render_prefix([], [], [])
    assert [e["source_case_id"] for e in seen["d2"]["episodes"]] == ["d1"]
    assert "Confirmed answer: Aortic dissection (option B in this question) (the agent" in seen["d2"]["prefix"]


def test_a_precedent_says_the_agent_was_wrong_without_naming_the_wrong_answer():
    """Measured with the local model: "the agent answered Acute pericarditis, which was wrong" in a
    precedent made it answer Acute pericarditis for a case whose own findings it had read as PID."""
    from grandrounds.handlers.policies.precedents import precedent_line

    wrong = precedent_line("Fever and adnexal tenderness.", "Pelvic inflammatory disease", "Acute pericarditis",
                           False, "")
    assert "Acute pericarditis" not in wrong and "the agent's answer was wrong" in wrong
    assert "Confirmed answer: Pelvic inflammatory disease" in wrong
    legacy = precedent_line("Fever and adnexal tenderness.", "Pelvic inflammatory disease", "Acute pericarditis",
                            False, "", name_wrong=True)
    assert "the agent answered Acute pericarditis, which was wrong" in legacy
    with EventStore(":memory:") as store:  # sim answers the first case wrongly? then the precedent must not name it
        _sim(store, [DISSECTION_1, DISSECTION_2], load_policy("precedent"), "prec")
        prefix = _retrieved(store, "prec")["d2"]["prefix"]
    for text in OPTS.values():
        if text != "Aortic dissection":
            assert text not in prefix


def test_a_recorded_config_without_a_later_field_rebuilds_with_the_behaviour_it_had():
    """Runs recorded before `name_wrong_answers` named wrong answers: they re-execute that way
    (the golden logs hold such runs), while a new run's config says false."""
    from grandrounds.handlers.policies.config import policy_from_dict, policy_record, policy_to_dict
    from grandrounds.handlers.policies.precedent import PrecedentPolicy

    for cls in (EvoMedAgentPolicy, PrecedentPolicy):
        fresh = cls()
        assert fresh.name_wrong_answers is False
        old = {k: v for k, v in policy_to_dict(fresh).items() if k != "name_wrong_answers"}
        assert policy_from_dict(old, recorded=True).name_wrong_answers is True
        assert policy_from_dict(old).name_wrong_answers is False
        assert policy_from_dict(policy_to_dict(fresh), recorded=True).name_wrong_answers is False
        legacy = cls(name_wrong_answers=True)  # recorded as runs before the field were: without it
        assert "name_wrong_answers" not in policy_record(legacy) and "name_wrong_answers" in policy_record(fresh)
        assert policy_from_dict(policy_record(legacy), recorded=True) == legacy


# --- the gate on a model's reflection --------------------------------------------------------------


class _FindingReflector(FakeOpenAI):
    """Reflects like the issue's small model: a rule that is only a finding, one that is only the
    answer's name, a lesson naming a letter, and one good rule."""

    def _reflection(self, messages, action):
        return json.dumps({"summary": "The correct diagnosis should have been E.",
                           "guideline": "The correct diagnosis should have been E.",
                           "edits": [{"op": "add", "text": "scalp tenderness", "trigger": ["scalp"], "priority": 0},
                                     {"op": "add", "text": "Begin high-dose glucocorticoids immediately",
                                      "trigger": ["vision"], "priority": 0},
                                     {"op": "add", "text": "Visual symptoms with jaw claudication call for "
                                                           "glucocorticoids before any biopsy.",
                                      "trigger": ["jaw", "claudication"], "priority": 1}]})


def test_reflections_pass_the_review_gate_before_they_become_memory():
    from conftest import EXAMPLES
    from grandrounds.handlers.cases import load_cases

    case = load_cases(EXAMPLES)[0][0]
    with _FindingReflector() as server, EventStore(":memory:") as store:
        spec = RunSpec(policy=EvoMedAgentPolicy(memory_min_subjects=1), backbone="openai", model=MODEL, seed=0)  # (gate off: see _sim)
        run(store, [case], spec, "r", live_options(server))
        refl = next(e.payload for e in store.iter("r", types=["reflection.recorded"]))
        rules = [e.payload["text"] for e in store.iter("r", types=["rule.added"])]
        episode = next(e.payload for e in store.iter("r", types=["episode.stored"]))
    assert rules == ["Visual symptoms with jaw claudication call for glucocorticoids before any biopsy."]
    assert refl["review"] == ["edit 0: only a finding of this case", "edit 1: only the name of option B",
                              "guideline: names an option by its letter"]
    assert episode["guideline"] == ""
