"""The openai path of the SkeMex and SELSM policies' model tasks, against the local fake server.

A subclass of the fake OpenAI-compatible server answers each policy's structured requests
(recognised by their system prompt) with valid JSON for the requested schema, built from what
the prompt legitimately shows after feedback (the reference answer's option text). The tests
prove that the exchanges are recorded as `llm.exchange` before the memory events built from
them, that those memory events carry the model's text, that a later case's actor prompt shows
it, that the `record` backend re-executes the run with the server stopped to the same
fingerprint, that SELSM's entity checker keeps an identifier the model wrote out of memory,
and that a malformed reply gets one recorded repair and, still malformed, writes nothing.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import EXAMPLES
from fake_openai_server import FakeOpenAI
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.llm.record import RecordedExchanges
from grandrounds.handlers.policies.selsm.config import SelsmPolicy
from grandrounds.handlers.policies.selsm.judge import JUDGE_SYSTEM
from grandrounds.handlers.policies.skemex.config import SkeMexPolicy
from grandrounds.handlers.policies.skemex.distill import SYSTEM_ASSESS, SYSTEM_DRAFT
from grandrounds.handlers.runs import RunSpec
from llm_helpers import MODEL, live_options, run
from grandrounds.store.eventstore import EventStore
from grandrounds.handlers.policies.selsm.events import LogicalSkill, render_skill as render_logical_skill

MALFORMED = "Sure! Here is what I think: the agent should be more careful next time."
MRN = "S6534835"
URL = "https://ehr.example.org/fhir/Patient"

# Two presentations of the same pattern (giant-cell arteritis → glucocorticoids now), one unrelated case between.
FIRST, OTHER, LATER = "ex-001", "ex-002", "ex-016"


class PolicyServer(FakeOpenAI):
    """The fake server, also playing SkeMex's encoder and writer and SELSM's step judge.

    `broken[system]`: how many of that task's next replies are malformed (repairs included);
    `leak`: text put into every SELSM skill's Task Scenario (an identifier the checker must catch).
    What it returned is kept per task in `returned`."""

    def __init__(self, broken: dict[str, int] | None = None, leak: str | None = None):
        super().__init__()
        self.broken = dict(broken or {})
        self.leak = leak
        self.returned: dict[str, list[dict]] = {"assess": [], "draft": [], "judge": []}

    def _text(self, kind, messages, action):
        system = messages[0]["content"]
        task = {SYSTEM_ASSESS: "assess", SYSTEM_DRAFT: "draft", JUDGE_SYSTEM: "judge"}.get(system)
        if task is None:
            return super()._text(kind, messages, action)
        if self.broken.get(task, 0) > 0:
            self.broken[task] -= 1
            return MALFORMED
        prompt = messages[1]["content"]  # a repair request repeats it, then adds the failed turn
        data = {"assess": _assessment, "draft": _draft, "judge": self._verdict}[task](prompt)
        self.returned[task].append(data)
        return json.dumps(data)

    def _verdict(self, prompt: str) -> dict:
        gold_letter, gold = re.search(r"the correct answer is ([A-Z])\) (.+)\.$", prompt).groups()
        steps = []
        for block in prompt.split("### Round ")[1:]:
            round_ = int(block.split("\n", 1)[0])
            action = re.search(r"^action: (.+)$", block, re.MULTILINE).group(1)
            right = action == f"answer {gold_letter}"
            scenario = "A vignette whose defining findings point to one management choice"
            steps.append({
                "round": round_, "label": "+" if right else "-", "category": "Clinical Reasoning",
                "task_scenario": scenario + (f" (seen for {self.leak})" if self.leak else "") + ".",
                "generalized_logic": "Weigh the defining findings together before surface word overlap.",
                "canonical_example": f"Those defining findings together -> favour '{gold}'.",
                "error_avoidance": "Do not pick an option only because it shares words with the vignette.",
                "trigger": ["defining findings", "management"]})
        return {"steps": steps}


def _assessment(prompt: str) -> dict:
    injected = re.findall(r"^\[(\w+)\] ", prompt.split("## Injected skills", 1)[1], re.MULTILINE)
    labels = [{"skill_id": i, "label": "adopted+", "evidence": "the answer carries out its core action"}
              for i in injected]
    if injected:
        return {"labels": labels, "decision": "NONE", "rationale": "the injected skill already covers it"}
    return {"labels": [], "decision": "CREATE", "branch": "task",
            "rationale": "a recurring presentation with a decisive management step no skill covers"}


def _draft(prompt: str) -> dict:
    gold = re.search(r"reference answer [A-Z]\) (.+)$", prompt, re.MULTILINE).group(1)
    return {"name": "decisive_findings_management_choice",
            "description": "When a vignette's defining findings point to one urgent management step.",
            "applicable_conditions": "The defining findings are all present together.",
            "core_action": f"Name the defining findings, then favour '{gold}'; do not wait for confirmatory tests.",
            "trigger": ["headache", "jaw", "claudication", "temporal", "artery", "vision"],
            "required_tools": [], "risk_level": "high"}


@pytest.fixture(scope="module")
def cases():
    by_id = {c.case_id: c for c in load_cases(EXAMPLES)[0]}
    return [by_id[FIRST], by_id[OTHER], by_id[LATER]]


def _events(store, run_id, *types):
    return list(store.iter(run_id, types=list(types) or None))


def _exchanges(store, run_id, *purposes):
    return [e for e in _events(store, run_id, "llm.exchange") if e.payload["purpose"] in purposes]


def _actor_requests(server, case):
    """The actor's requests for `case` as the server received them."""
    return [r for r in server.requests if r["messages"][0]["content"] not in (SYSTEM_ASSESS, SYSTEM_DRAFT,
                                                                              JUDGE_SYSTEM)
            and case.question in r["messages"][1]["content"]]


def _live(store, cases, policy, run_id, server):
    spec = RunSpec(policy=policy, backbone="openai", model=MODEL, seed=0)
    return spec, run(store, cases, spec, run_id, live_options(server))


def _replayed(store, cases, spec, source):
    rec = RecordedExchanges.from_store(store, source)
    out = run(store, cases, spec, f"{source}-replayed", {"recorded": rec})
    served = {e.meta["served"] for e in _events(store, f"{source}-replayed", "llm.exchange")}
    return out, rec, served


# --- SkeMex ----------------------------------------------------------------------------------

# memory_min_subjects=1: these check that the model's drafts become memory verbatim; the k-subjects gate, which
# withholds words too few patients' cases hold, has its own tests (tests/test_privacy_freetext.py)
SKEMEX = SkeMexPolicy(window=1, governance_every=1, buffer_gating=False, memory_min_subjects=1)
"""Every trajectory is distilled as its case closes, governance after every window."""


@pytest.fixture(scope="module")
def skemex(cases):
    store = EventStore(":memory:")
    with PolicyServer() as server:
        spec, out = _live(store, cases, SKEMEX, "sk", server)
    yield store, spec, out, server  # the server is stopped from here on
    store.close()


def test_skemex_distillation_is_recorded_before_the_skill_it_writes(skemex):
    store, _, out, server = skemex
    assert out.summary["failed"] == 0
    assess = _exchanges(store, "sk", "skill-assess")
    draft = _exchanges(store, "sk", "skill-draft")
    assert [e.case_id for e in assess] == [FIRST, OTHER, LATER]  # window 1: every case closes one
    assert {e.payload["stage"] for e in assess + draft} == {"reflect"}  # governance asks no model
    assert {e.payload["params"]["response_format"]["json_schema"]["name"] for e in assess} == {"Assessment"}
    assert {e.payload["params"]["response_format"]["json_schema"]["name"] for e in draft} == {"Draft"}
    assert all(e.payload["outcome"] == "ok" for e in assess + draft)

    first_assessed = _events(store, "sk", "skill.trajectory_assessed")[0]
    drafted = _events(store, "sk", "skill.drafted")
    reviewed = _events(store, "sk", "skill.reviewed")
    assert [e.case_id for e in drafted] == [FIRST, OTHER]  # LATER is covered by the injected skill: NONE
    assert assess[0].seq < first_assessed.seq < draft[0].seq < drafted[0].seq < reviewed[0].seq
    assert draft[1].seq < drafted[1].seq
    governed = _events(store, "sk", "skill.governed")
    assert governed and governed[0].seq > reviewed[0].seq and governed[0].payload["window"] == 0


def test_skemex_skills_are_the_models_drafts_and_reach_the_later_actor(skemex, cases):
    store, _, _, server = skemex
    returned = server.returned["draft"]
    drafted = _events(store, "sk", "skill.drafted")
    body = drafted[0].payload["body"]
    assert body["core_action"] == returned[0]["core_action"]
    assert "favour 'Begin high-dose glucocorticoids immediately'" in body["core_action"]  # the gold it was shown
    assert body["name"] == returned[0]["name"] and body["risk_level"] == "high"
    assert body["trigger"] == returned[0]["trigger"] and drafted[0].payload["branch"] == "task"
    skill_id = drafted[0].payload["skill_id"]
    review = next(e.payload for e in _events(store, "sk", "skill.reviewed") if e.payload["skill_id"] == skill_id)
    assert review["accepted"] and review["kind"] == "create"  # → active

    assessed = _events(store, "sk", "skill.trajectory_assessed")
    assert assessed[0].payload["rationale"] == server.returned["assess"][0]["rationale"]
    later = next(e.payload for e in _events(store, "sk", "memory.retrieved") if e.case_id == LATER)
    shown = [i for i in later["items"] if i["item_id"] == skill_id]
    assert shown and returned[0]["core_action"] in shown[0]["text"]
    actor = _actor_requests(server, cases[2])
    assert actor and all(shown[0]["text"] in r["messages"][1]["content"] for r in actor)
    assert all(returned[0]["core_action"] not in r["messages"][1]["content"] for r in _actor_requests(server, cases[0]))
    answer = next(e.payload for e in _events(store, "sk", "answer.given") if e.case_id == LATER)
    assert answer["answer"] == cases[2].answer  # the fake actor followed the skill's "favour '...'"
    assert any(s["content"].startswith("A memory rule names option") for s in answer["steps"])
    # Pass 1 of the later case saw the injected skill and its label is the model's.
    assert f"[{skill_id}] " in assess_prompt(store, LATER)
    assert assessed[2].payload["labels"] == {skill_id: "adopted+"} and assessed[2].payload["decision"] == "NONE"


def assess_prompt(store, case_id):
    return next(e.payload["messages"][1]["content"] for e in _exchanges(store, "sk", "skill-assess")
                if e.case_id == case_id)


def test_skemex_record_backend_reexecutes_the_run_with_the_server_stopped(skemex, cases):
    store, spec, out, _ = skemex
    again, rec, served = _replayed(store, cases, spec, "sk")
    assert again.summary["fingerprint"] == out.summary["fingerprint"]
    assert rec.remaining == 0 and served == {"record"}


def test_skemex_malformed_distillation_is_repaired_once_then_writes_nothing(cases):
    with PolicyServer(broken={"assess": 2}) as server, EventStore(":memory:") as store:
        _, out = _live(store, cases[:1], SKEMEX, "bad", server)
        assess = _exchanges(store, "bad", "skill-assess", "skill-assess-repair")
        types = [e.type for e in _events(store, "bad")]
        closed = _events(store, "bad", "skill.window_closed")[0].payload
    assert [e.payload["purpose"] for e in assess] == ["skill-assess", "skill-assess-repair"]
    assert [e.payload["response"] for e in assess] == [MALFORMED, MALFORMED]
    repair = assess[1].payload["messages"]
    assert repair[2] == {"role": "assistant", "content": MALFORMED} and "did not validate" in repair[3]["content"]
    # The window's trajectory could not be distilled: recorded with the window, nothing written from it.
    assert closed["failed"] == [FIRST] and closed["distilled"] == []
    assert not {"skill.trajectory_assessed", "skill.drafted", "skill.reviewed", "skill.patched"} & set(types)
    assert out.summary["failed"] == 0  # the case itself was answered and graded


def test_skemex_a_repaired_draft_is_written_from_the_repair(cases):
    with PolicyServer(broken={"draft": 1}) as server, EventStore(":memory:") as store:
        _live(store, cases[:1], SKEMEX, "fixed", server)
        draft = _exchanges(store, "fixed", "skill-draft", "skill-draft-repair")
        drafted = _events(store, "fixed", "skill.drafted")
    assert [e.payload["purpose"] for e in draft] == ["skill-draft", "skill-draft-repair"]
    assert len(drafted) == 1 and draft[1].seq < drafted[0].seq
    assert drafted[0].payload["body"]["core_action"] == json.loads(draft[1].payload["response"])["core_action"]


# --- SELSM -----------------------------------------------------------------------------------

SELSM = SelsmPolicy(train_samples=2, state_threshold=0.1, memory_min_subjects=1)  # (gate off: see SKEMEX)
"""One sampled re-run per case (K = 2, recorded under reflect); θ low enough for the hashing embedder."""


@pytest.fixture(scope="module")
def selsm(cases):
    store = EventStore(":memory:")
    with PolicyServer() as server:
        spec, out = _live(store, cases, SELSM, "se", server)
    yield store, spec, out, server
    store.close()


def test_selsm_judging_is_recorded_before_the_record_it_writes(selsm):
    store, _, out, _ = selsm
    assert out.summary["failed"] == 0
    judge = _exchanges(store, "se", "selsm-step-judge")
    assert [e.case_id for e in judge] == [FIRST, FIRST, OTHER, OTHER, LATER, LATER]  # K = 2 per case
    assert {e.payload["stage"] for e in judge} == {"reflect"}
    assert {e.payload["params"]["response_format"]["json_schema"]["name"] for e in judge} == {"JudgeVerdict"}
    sampled = [e for e in _events(store, "se", "llm.exchange")
               if e.payload["purpose"].startswith("react-step-") and e.payload["stage"] == "reflect"]
    assert {e.case_id for e in sampled} == {FIRST, OTHER, LATER}  # the re-run is recorded under reflect
    for case_id in (FIRST, OTHER, LATER):
        calls = [e for e in judge if e.case_id == case_id]
        judged = [e for e in _events(store, "se", "selsm.trajectory.judged") if e.case_id == case_id]
        stored = [e for e in _events(store, "se", "selsm.record.stored") if e.case_id == case_id]
        assert [j.payload["sample"] for j in judged] == [0, 1] and len(stored) == 1
        assert calls[0].seq < judged[0].seq < calls[1].seq < judged[1].seq < stored[0].seq


def test_selsm_records_hold_the_judges_skills_and_guide_the_later_step(selsm, cases):
    store, _, _, server = selsm
    first = next(e.payload for e in _events(store, "se", "selsm.record.stored") if e.case_id == FIRST)
    returned = server.returned["judge"][0]["steps"][0]
    (t,) = first["transitions"]  # both samples gave the same tuple: the set keeps it once, from sample 0
    assert t["sample"] == 0 and t["action"].startswith("answer ")
    skill = t["skill"]
    assert (skill["scenario"], skill["logic"], skill["example"], skill["avoidance"]) == (
        returned["task_scenario"], returned["generalized_logic"], returned["canonical_example"],
        returned["error_avoidance"])
    assert skill["trigger"] == returned["trigger"]
    assert "favour 'Begin high-dose glucocorticoids immediately'" in skill["example"]
    text = render_logical_skill(LogicalSkill(**skill))

    # SELSM injects before every decision: the later case's first (only) decision is guided by it.
    answer = next(e.payload for e in _events(store, "se", "answer.given") if e.case_id == LATER)
    assert (answer["steps"][0]["kind"], answer["steps"][0]["content"]) == ("memory", t["skill_id"])
    actor = _actor_requests(server, cases[2])
    assert actor and all("## Guidance for this step\n- " + text in r["messages"][1]["content"] for r in actor)
    assert answer["answer"] == cases[2].answer
    assert any(s["content"].startswith("A memory rule names option") for s in answer["steps"])
    assert all(text not in r["messages"][1]["content"] for r in _actor_requests(server, cases[0]))


def test_selsm_record_backend_reexecutes_the_run_with_the_server_stopped(selsm, cases):
    store, spec, out, _ = selsm
    again, rec, served = _replayed(store, cases, spec, "se")
    assert again.summary["fingerprint"] == out.summary["fingerprint"]
    assert rec.remaining == 0 and served == {"record"}


@pytest.mark.parametrize("leak, category", [(f"record {MRN}", "identifier"), (URL, "url")])
def test_selsm_an_identifier_from_the_model_is_rejected_and_never_stored(cases, leak, category):
    policy = SELSM.model_copy(update={"train_samples": 1})
    with PolicyServer(leak=leak) as server, EventStore(":memory:") as store:
        _, out = _live(store, cases[:1], policy, "leak", server)
        judge = _exchanges(store, "leak", "selsm-step-judge")
        judged = _events(store, "leak", "selsm.trajectory.judged")
        rejected = _events(store, "leak", "selsm.skill.rejected")
        stored = _events(store, "leak", "selsm.record.stored")
    assert out.summary["failed"] == 0
    assert len(judge) == 1 and leak in judge[0].payload["response"]
    assert len(rejected) == 1 and judge[0].seq < judged[0].seq < rejected[0].seq
    r = rejected[0].payload
    assert leak in r["text"] and any(v["category"] == category and MRN in v["match"] if category == "identifier"
                                     else v["category"] == category for v in r["violations"])
    assert stored == []  # its only skill was rejected: no record


def test_selsm_malformed_judging_is_repaired_once_then_fails_the_case_at_reflect(cases):
    policy = SELSM.model_copy(update={"train_samples": 1})
    with PolicyServer(broken={"judge": 2}) as server, EventStore(":memory:") as store:
        spec, out = _live(store, cases[:1], policy, "bad", server)
        judge = _exchanges(store, "bad", "selsm-step-judge", "selsm-step-judge-repair")
        failed = _events(store, "bad", "case.failed")
        types = [e.type for e in _events(store, "bad")]
        again, rec, served = _replayed(store, cases[:1], spec, "bad")
    assert [e.payload["purpose"] for e in judge] == ["selsm-step-judge", "selsm-step-judge-repair"]
    assert [e.payload["response"] for e in judge] == [MALFORMED, MALFORMED]
    assert "did not validate" in judge[1].payload["messages"][-1]["content"]
    assert len(failed) == 1 and failed[0].payload["stage"] == "reflect" and failed[0].case_id == FIRST
    assert "selsm-step-judge failed" in failed[0].payload["reason"] and failed[0].seq > judge[1].seq
    assert not {"selsm.trajectory.judged", "selsm.skill.rejected", "selsm.record.stored"} & set(types)
    # answered and graded, nothing learnt: a reflection that could not be had fails no answered case
    assert out.summary["failed"] == 0 and out.summary["reflections_failed"] == 1 and "answer.given" in types
    assert again.summary["fingerprint"] == out.summary["fingerprint"] and rec.remaining == 0
