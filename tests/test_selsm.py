"""SELSM (seed 000): entity checker, records and fold, two-stage retrieval, judging, learning, offline mode.

Runs use the fast hashing embedder (tests/llm_helpers.py): MiniLM costs ~24 ms a text, and
SELSM embeds every query, state and skill. Learning numbers are with the sim backbone: a
mechanism check, not clinical accuracy.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from grandrounds.cli import main
from grandrounds.handlers.cases import Case, load_cases
from grandrounds.handlers.policies.config import NoMemoryPolicy, load_policy, with_ablations
from grandrounds.handlers.policies.selsm import judge as judge_mod
from grandrounds.handlers.policies.selsm.config import SelsmPolicy
from grandrounds.handlers.policies.selsm.entity_check import check_skill, find_entities
from grandrounds.handlers.policies.selsm.judge import decisions_of, judge_prompt
from grandrounds.handlers.policies.selsm.retrieval import candidate_records, state_only, two_stage
from grandrounds.handlers.runs import RunSpec, open_run
from grandrounds.handlers.text import key_terms
from llm_helpers import HashEmbedder
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.event_types import AgentStep, AnswerGiven
from grandrounds.store.eventstore import EventStore
from grandrounds.handlers.policies.selsm.events import LogicalSkill, RecordStored, StoredTransition
from grandrounds.handlers.policies.selsm.memory import SelsmMemory as SelsmPart
from grandrounds.streams.embedded import EmbeddedRunner

SELSM_WRITES = {"selsm.trajectory.judged", "selsm.skill.rejected", "selsm.record.stored"}


def _run(store: EventStore, cases, policy, run_id="r", tools=None):
    ctx, _ = open_run(store, run_id, RunSpec(policy=policy, seed=0, tools=tools or {}),
                      EmbeddingCache(HashEmbedder(), store.conn))
    asyncio.run(EmbeddedRunner(ctx).run(cases))
    return ctx


def _payloads(store: EventStore, run_id: str, etype: str) -> list[tuple[str | None, dict]]:
    return [(e.case_id, e.payload) for e in store.iter(run_id, types=[etype])]


def _correct(store: EventStore, run_id: str) -> int:
    return sum(p["correct"] for _, p in _payloads(store, run_id, "case.completed"))


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases(EXAMPLES)[0]


@pytest.fixture(scope="module")
def learned(cases):
    """The example stream with the paper's defaults, with θ = 0.7, and the memory-free baseline."""
    store = EventStore(":memory:")
    _run(store, cases, SelsmPolicy(), "paper")
    _run(store, cases, SelsmPolicy(state_threshold=0.7), "theta07")
    _run(store, cases, NoMemoryPolicy(), "none")
    yield store
    store.close()


# --- config --------------------------------------------------------------------------------------


def test_preset_file_equals_the_class_defaults_and_the_papers_values():
    cfg = load_policy("selsm")
    assert cfg == SelsmPolicy()
    assert (cfg.top_q_records, cfg.state_threshold, cfg.top_m_skills, cfg.train_samples) == (5, 0.9, 1, 3)
    assert with_ablations(cfg, ["no-two-stage"]).two_stage is False
    assert with_ablations(cfg, ["no-operational-logic"]).operational_logic is False
    assert with_ablations(cfg, ["no-reasoning-trace"]).reasoning_trace is False
    assert with_ablations(cfg, ["no-writing"]).writing is False


# --- entity-agnostic checker -----------------------------------------------------------------------


def _skill(example: str, **kw) -> LogicalSkill:
    base = dict(label="+", category="Parameter Mapping", scenario="A case presenting with fever and neck stiffness.",
                logic="Map the findings together to the option that explains all of them.", example=example,
                avoidance="Do not answer by word overlap.", trigger=["fever", "neck", "stiffness"])
    return LogicalSkill(**{**base, **kw})


@pytest.mark.parametrize("text,category", [
    ("Look up MRN S6534835 before ordering.", "identifier"),
    ("Query the record for patient id 48213 first.", "identifier"),
    ("Fetch Patient/S2016972 then check allergies.", "identifier"),
    ("Ask Dr. Whitfield to confirm the order.", "name"),
    ("The patient named Eleanor had the same findings.", "name"),
    ("As with John Carter, start antibiotics.", "name"),
    ("GET http://localhost:8080/fhir/Observation?code=A1C first.", "url"),
    ("See www.example.org for the formulary.", "url"),
    ("Labs drawn on 2023-11-12 were normal.", "date"),
    ("Since March 3, 2021 the dose was stable.", "date"),
    ("Compare with the 04/05/2022 result.", "date"),
    ("Reuse the 7734219 result as the template.", "instance-number"),
    ("Reference value 123456789 applies.", "instance-number"),
])
def test_the_checker_rejects_each_entity_category(text, category):
    violations = check_skill(_skill(text))
    assert category in {v.category for v in violations}, violations


def test_numbers_copied_from_the_instance_are_rejected_but_option_numbers_pass():
    instance = "A 72-year-old woman with ESR 96 mm/h."
    assert [v.category for v in find_entities("If ESR is 96, biopsy.", instance)] == ["instance-number"]
    assert find_entities("Give 81 mg aspirin.", instance, allowed_text="Low-dose aspirin 81 mg") == []
    assert find_entities("Start 81 mg aspirin.", "Case without that number.") == []  # a short generic value


def test_the_checker_accepts_a_clean_skill():
    assert check_skill(_skill("Presentation with fever, neck stiffness -> answer 'Bacterial meningitis'.")) == []
    # An eponym the options use is a clinical term, not a person.
    eponym = _skill("Visual hallucinations with intact insight -> answer 'Charles Bonnet syndrome'.")
    assert check_skill(eponym, allowed_text="Charles Bonnet syndrome") == []


def test_a_rejected_skill_is_recorded_as_an_event_and_never_stored(cases, monkeypatch):
    original = judge_mod.offline_verdict

    def leaky(case, decisions, answer, correct):  # the judge copies an endpoint into every 3rd case's skills
        verdict = original(case, decisions, answer, correct)
        if int(case.case_id.split("-")[1]) % 3:
            return verdict
        steps = [s.model_copy(update={"canonical_example": s.canonical_example + " via GET http://ehr.local/fhir"})
                 for s in verdict.steps]
        return verdict.model_copy(update={"steps": steps})

    monkeypatch.setattr(judge_mod, "offline_verdict", leaky)
    store = EventStore(":memory:")
    ctx = _run(store, cases[:12], SelsmPolicy())
    rejected = _payloads(store, "r", "selsm.skill.rejected")
    assert rejected and {cid for cid, _ in rejected} == {"ex-003", "ex-006", "ex-009", "ex-012"}
    assert all(p["violations"][0]["category"] == "url" and "http://" in p["text"] for _, p in rejected)
    stored = _payloads(store, "r", "selsm.record.stored")
    assert all("http://" not in json.dumps(p) for _, p in stored)
    assert {cid for cid, _ in stored}.isdisjoint({cid for cid, _ in rejected})  # nothing left to store there
    part = ctx.projection.state.policy_memory
    assert part.counts()["selsm_rejected_skills"] == len(rejected) == 4 * 3  # K = 3 samples each


# --- records, fold and two-stage retrieval ------------------------------------------------------


DIM = 16


def _e(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = 1.0
    return v


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def _with_cosine(c: float, base: int, other: int) -> np.ndarray:
    return (c * _e(base) + np.sqrt(1 - c * c) * _e(other)).astype(np.float32)


class _Vectors:
    """A fold embedder over hand-made vectors: exact cosines, no model."""

    def __init__(self, table: dict[str, np.ndarray]):
        self.table = table

    def __call__(self, text: str) -> np.ndarray:
        return self.table.get(text, _e(DIM - 1))


def _record(rid: str, case_id: str, query: str, transitions: list[tuple[str, int, str]]) -> RecordStored:
    return RecordStored(record_id=rid, source_case_id=case_id, query=query, transitions=[
        StoredTransition(skill_id=f"{rid}.0.{rnd}", sample=0, round=rnd, state=state, action="call x",
                         skill=_skill(f"example {skill}")) for state, rnd, skill in transitions])


def test_state_polysemy_is_resolved_by_anchoring_on_the_query():
    """The same intermediate state ("search successful") in two workflows: the medication workflow
    stored it at a later round, the vital-signs workflow at round 1. A vital-signs case must get
    the vital-signs skill; by state alone the later-round medication skill wins the tie."""
    vec = {"order medication": _e(0), "search successful": _e(10), "other state": _e(11)}
    for i in range(5):
        vec[f"record vital sign {i}"] = _unit(_e(1) + 0.2 * _e(2 + i))
    mem = SelsmPart(DIM)
    embed = _Vectors(vec)
    mem.apply(1, _record("rec-med", "c-med", "order medication", [("search successful", 3, "MED")]), embed)
    mem.apply(2, _record("rec-vit", "c-vit", "record vital sign 0", [("search successful", 1, "VIT")]), embed)
    for i in range(1, 5):
        mem.apply(2 + i, _record(f"rec-v{i}", f"c-v{i}", f"record vital sign {i}", [("other state", 2, "X")]), embed)
    query, state = _e(1), vec["search successful"]

    anchored = two_stage(mem, query, state, "new", top_q=5, theta=0.9, top_m=1)
    assert [h.transition.skill.example for h in anchored] == ["example VIT"]
    assert anchored[0].state_score == 1.0 and anchored[0].query_score > 0.9
    assert "rec-med" not in {mem.records[p].record_id for p, _ in candidate_records(mem, query, 5, "new")}

    by_state = state_only(mem, state, "new", theta=0.9, top_m=1, pool=64)
    assert [h.transition.skill.example for h in by_state] == ["example MED"]  # the other workflow's skill


def test_transitions_rank_by_state_score_then_round_and_theta_drops_the_rest():
    vec = {"q": _e(0), "s95a": _with_cosine(0.95, 5, 6), "s95b": _with_cosine(0.95, 5, 7),
           "s99": _with_cosine(0.99, 5, 8), "s85": _with_cosine(0.85, 5, 9)}
    mem = SelsmPart(DIM)
    mem.apply(1, _record("rec-a", "a", "q", [("s95a", 1, "A1"), ("s85", 9, "A9")]), _Vectors(vec))
    mem.apply(2, _record("rec-b", "b", "q", [("s95b", 3, "B3"), ("s99", 1, "B1")]), _Vectors(vec))
    hits = two_stage(mem, _e(0), _e(5), "new", top_q=5, theta=0.9, top_m=10)
    assert [(h.transition.skill.example, h.state_score) for h in hits] == [
        ("example B1", 0.99), ("example B3", 0.95), ("example A1", 0.95)]  # equal score: later round first
    assert [h.transition.skill.example for h in two_stage(mem, _e(0), _e(5), "new", 5, 0.9, 1)] == ["example B1"]
    assert len(two_stage(mem, _e(0), _e(5), "new", 5, 0.8, 10)) == 4  # θ = 0.8 keeps the 0.85 one


def test_a_case_never_retrieves_its_own_record():
    vec = {"q": _e(0), "s": _e(5)}
    mem = SelsmPart(DIM)
    mem.apply(1, _record("rec-own", "c1", "q", [("s", 1, "OWN")]), _Vectors(vec))
    assert two_stage(mem, _e(0), _e(5), "c1", 5, 0.9, 1) == []
    assert state_only(mem, _e(5), "c1", 0.9, 1, 64) == []
    assert [h.record.record_id for h in two_stage(mem, _e(0), _e(5), "c2", 5, 0.9, 1)] == ["rec-own"]


def test_no_injected_skill_in_a_run_comes_from_the_case_itself(learned):
    origin = {}
    for cid, p in _payloads(learned, "theta07", "selsm.record.stored"):
        origin.update({t["skill_id"]: cid for t in p["transitions"]})
    shown = 0
    for cid, p in _payloads(learned, "theta07", "answer.given"):
        ids = [i for s in p["steps"] if s["kind"] == "memory" for i in s["content"].split(",") if i]
        shown += len(ids)
        assert all(origin[i] != cid for i in ids)
    assert shown > 30


# --- judging -------------------------------------------------------------------------------------


def test_decisions_rebuild_the_states_the_agent_loops_retrieve_with():
    steps = [AgentStep(kind="memory", content="rec-00001.0.1"), AgentStep(kind="reasoning", content="check labs"),
             AgentStep(kind="tool", content='{"arguments": {}, "name": "labs"}'),
             AgentStep(kind="observation", content="labs -> B"),
             AgentStep(kind="memory", content=""), AgentStep(kind="reasoning", content="bad turn"),
             AgentStep(kind="observation", content="format error: no action"),
             AgentStep(kind="memory", content=""), AgentStep(kind="reasoning", content="B fits"),
             AgentStep(kind="response", content="B")]
    ds = decisions_of("Q?", steps)
    assert [(d.round, d.action) for d in ds] == [(1, "call labs"), (2, "invalid action"), (3, "answer B")]
    assert ds[0].state == "Q?" and ds[0].memory == "rec-00001.0.1"
    assert ds[2].state == "Q?\nstep 1: call labs -> labs -> B\nstep 2: invalid action -> format error: no action"


def test_offline_judge_writes_a_paradigm_for_right_and_an_axiom_naming_the_gold_for_wrong(cases):
    case = cases[0]
    gold = case.options[case.answer]
    wrong = next(k for k in case.options if k != case.answer)
    for letter, label in ((case.answer, "+"), (wrong, "-")):
        ans = AnswerGiven(answer=letter, source="lexical", steps=[AgentStep(kind="response", content=letter)])
        ds = decisions_of(case.question, ans.steps)
        (step,) = judge_mod.judged_steps(judge_mod.offline_verdict(case, ds, ans, letter == case.answer), ds, case,
                                         operational_logic=True)
        assert step.skill.label == label and f"'{gold}'" in step.skill.example
        assert step.skill.logic and step.skill.avoidance and step.skill.trigger == key_terms(case.question)
        assert check_skill(step.skill, case.question, "\n".join(case.options.values())) == []
        if label == "-":
            assert case.options[wrong] not in json.dumps(step.skill.model_dump())  # names no wrong option


def test_without_reasoning_trace_the_judge_sees_actions_and_observations_only(cases):
    case = cases[0]
    ans = AnswerGiven(answer="B", source="lexical", steps=[AgentStep(kind="reasoning", content="SECRET-THOUGHT"),
                                                          AgentStep(kind="response", content="B")])
    ds = decisions_of(case.question, ans.steps)
    assert "SECRET-THOUGHT" in judge_prompt(case, ds, ans, True, reasoning_shown=True)
    hidden = judge_prompt(case, ds, ans, True, reasoning_shown=False)
    assert "SECRET-THOUGHT" not in hidden and "action: answer B" in hidden


def test_without_operational_logic_skills_keep_scenario_and_example_only(cases):
    store = EventStore(":memory:")
    _run(store, cases[:6], with_ablations(SelsmPolicy(), ["no-operational-logic"]))
    skills = [t["skill"] for _, p in _payloads(store, "r", "selsm.record.stored") for t in p["transitions"]]
    assert skills and all(s["logic"] == "" and s["avoidance"] == "" and s["scenario"] and s["example"]
                          for s in skills)


def test_training_phase_judges_k_seeded_samples_per_case(cases):
    store = EventStore(":memory:")
    _run(store, cases[:8], SelsmPolicy(), tools={"ddx": 0.5})
    judged = _payloads(store, "r", "selsm.trajectory.judged")
    by_case: dict[str, list[dict]] = {}
    for cid, p in judged:
        by_case.setdefault(cid, []).append(p)
    assert len(by_case) == 8 and all([p["sample"] for p in ps] == [0, 1, 2] for ps in by_case.values())
    # The samples differ through their own seeded tool draws: the tool round's verdicts are not all alike.
    labels = {cid: tuple(p["steps"][0]["label"] for p in ps) for cid, ps in by_case.items()}
    assert any(len(set(ls)) > 1 for ls in labels.values()), labels
    records = _payloads(store, "r", "selsm.record.stored")
    assert len(records) == 8  # one record per task holds the transitions of all its samples
    assert any(t["sample"] > 0 for _, rec in records for t in rec["transitions"])
    for _, rec in records:  # T_i is a set: a tuple several samples produced is stored once
        tuples = [(t["state"], t["action"], json.dumps(t["skill"], sort_keys=True)) for t in rec["transitions"]]
        assert len(tuples) == len(set(tuples))
    single = EventStore(":memory:")
    _run(single, cases[:3], SelsmPolicy(train_samples=1))
    assert [p["sample"] for _, p in _payloads(single, "r", "selsm.trajectory.judged")] == [0, 0, 0]


def test_no_writing_writes_nothing(cases):
    store = EventStore(":memory:")
    _run(store, cases[:6], with_ablations(SelsmPolicy(), ["no-writing"]))
    assert not SELSM_WRITES & {e.type for e in store.iter("r")}


# --- learning, verify, offline mode ------------------------------------------------------------


def test_the_example_stream_learns_above_the_memory_free_baseline(learned):
    none = _correct(learned, "none")
    assert none == 9  # 0.115
    # The paper's θ = 0.9 filters strictly (the sim's state is the question itself): 14/78 = 0.179 (15 with
    # de-identifier pattern set 2: the field tool's [NAME] in place of an eponym moves a state's vector).
    assert _correct(learned, "paper") == 14
    # θ = 0.7 lets paraphrased recurrences through: 47/78 = 0.603 (46 with pattern set 3, whose field tool withheld
    # eponyms a rules-2 tool keeps; 43 with pattern set 2, whose k-subjects rule withheld the words of the first
    # cases' states; 47 before that rule, tests/test_privacy_freetext.py).
    assert _correct(learned, "theta07") == 47
    followed = [p for _, p in _payloads(learned, "theta07", "answer.given") if p["source"].startswith("logical-skill:")]
    assert len(followed) >= 36  # 39 measured


def test_verify_re_executes_a_selsm_run_to_identical_bytes(cases, tmp_path, monkeypatch):
    monkeypatch.setattr("grandrounds.app.shared_minilm", HashEmbedder)
    monkeypatch.setattr("grandrounds.replay.execute.cache_embedder", HashEmbedder)
    short = tmp_path / "cases.jsonl"
    short.write_text("\n".join(EXAMPLES.read_text(encoding="utf-8").splitlines()[:30]) + "\n")
    db = str(tmp_path / "v.duckdb")
    res = CliRunner().invoke(main, ["run", str(short), "--db", db, "--policy", "selsm", "--run-id", "s",
                                    "--sim-tool", "ddx=0.6", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["memory"]["selsm_records"] == 30
    res = CliRunner().invoke(main, ["verify", "--db", db, "s", "--json"])
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and out["identical"] and out["fingerprint"] == out["replayed_fingerprint"]


def test_a_frozen_test_run_reads_the_train_records_and_writes_no_skill_events(tmp_path, monkeypatch):
    monkeypatch.setattr("grandrounds.app.shared_minilm", HashEmbedder)
    monkeypatch.setattr("grandrounds.replay.execute.cache_embedder", HashEmbedder)
    lines = EXAMPLES.read_text(encoding="utf-8").splitlines()
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("\n".join(lines[:39]) + "\n")
    test.write_text("\n".join(lines[39:]) + "\n")
    policy = tmp_path / "selsm07.toml"
    policy.write_text('name = "selsm"\nstate_threshold = 0.7\n')
    db = str(tmp_path / "o.duckdb")

    def run(*args):
        res = CliRunner().invoke(main, ["run", *args, "--db", db, "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    trained = run(str(train), "--policy", str(policy), "--run-id", "train")
    frozen = run(str(test), "--policy", str(policy), "--run-id", "test", "--memory-from", "train")
    none = run(str(test), "--policy", "none", "--run-id", "test-none")
    with EventStore(db, read_only=True) as store:
        types = [e.type for e in store.iter("test")]
        seeded = next(store.iter("test", types=["memory.seeded"])).payload
        sources = [e.payload["source"] for e in store.iter("test", types=["answer.given"])]
    assert types[:2] == ["run.started", "memory.seeded"] and not SELSM_WRITES & set(types)
    assert {e["type"] for e in seeded["events"]} >= {"selsm.record.stored"}
    assert frozen["memory"]["selsm_records"] == trained["memory"]["selsm_records"] == 39
    assert sum(s.startswith("logical-skill:rec-") for s in sources) > 10
    assert frozen["accuracy"] > none["accuracy"] + 0.3  # sim backbone: a mechanism check
    res = CliRunner().invoke(main, ["verify", "--db", db, "test", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["identical"]


# --- states within the embedder's window (issue 44, part 1) ---------------------------------------

def _fhir_bundle(code: str, values: list[float]) -> str:
    """A MedAgentBench-like GET response: ~100 wordpieces an entry, so one response fills MiniLM's window."""
    entries = [{"fullUrl": f"http://localhost:8080/fhir/Observation/{100 + i}", "resource": {
        "resourceType": "Observation", "id": str(100 + i), "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": code}], "text": code},
        "subject": {"reference": "Patient/S1234567"}, "effectiveDateTime": f"2023-11-1{i}T10:00:00+00:00",
        "valueQuantity": {"value": v, "unit": "mg/dL"}}, "search": {"mode": "match"}} for i, v in enumerate(values)]
    return "Here is the response from the GET request:\n" + json.dumps(
        {"resourceType": "Bundle", "type": "searchset", "total": len(entries), "entry": entries}, indent=2)


def test_two_states_that_differ_only_after_the_first_fhir_response_retrieve_their_own_skill():
    """After one FHIR response a state is far past MiniLM's 256 wordpieces. Embedded whole, two workflows
    that share the query and the first call but differ in what they did next embedded as one vector, and
    the tie-break returned the later round's skill for both; within the window each state finds its own."""
    from grandrounds.handlers.agent.step_memory import agent_state
    from grandrounds.handlers.policies.selsm.state_view import WHOLE, WINDOWED, embedded_state
    from grandrounds.store import wordpieces
    from grandrounds.store.embeddings import shared_minilm

    query = "Check patient S1234567's last serum magnesium and, if it is low, order IV replacement."
    get = ("GET http://localhost:8080/fhir/Observation?patient=S1234567&code=MG", _fhir_bundle("MG", [1.2, 1.3, 1.1, 1.4, 1.2]))
    order = [get, ('POST http://localhost:8080/fhir/MedicationRequest {"medicationCodeableConcept": '
                   '{"text": "magnesium sulfate IV"}, "dosageInstruction": [{"route": "IV"}]}', "POST request accepted")]
    answer = [get, ("FINISH([1.2])", "the task is finished")]
    states = {"order": agent_state(query, order), "answer": agent_state(query, answer)}
    assert all(wordpieces.count(s) > 2 * wordpieces.window() for s in states.values())

    model = shared_minilm()

    def memory(view: int) -> SelsmPart:
        mem = SelsmPart(model.dim)
        mem.state_view = view
        embed = model.embed_one
        mem.apply(1, _record("rec-order", "c-order", query, [(states["order"], 3, "ORDER")]), embed)
        mem.apply(2, _record("rec-answer", "c-answer", query, [(states["answer"], 4, "ANSWER")]), embed)
        return mem

    for view, expect in ((WINDOWED, {"order": "example ORDER", "answer": "example ANSWER"}),
                         (WHOLE, {"order": "example ANSWER", "answer": "example ANSWER"})):  # before: one vector
        mem = memory(view)
        for name, state in states.items():
            text = embedded_state(state, view)
            assert view == WHOLE or wordpieces.count(text) <= wordpieces.text_budget(), text
            hits = two_stage(mem, model.embed_one(query), model.embed_one(text), "new", top_q=5, theta=0.9, top_m=1)
            assert [h.transition.skill.example for h in hits] == [expect[name]], (view, name, hits)


def test_the_window_is_counted_as_the_embedder_counts_it():
    """store/wordpieces.py's pieces are the model's own: its tokenizer gives the same count (+ [CLS] and
    [SEP]), and it cuts at the same window."""
    from grandrounds.store import wordpieces
    from grandrounds.store.embeddings import shared_minilm

    model = shared_minilm()._load()
    assert wordpieces.window() == model.max_seq_length == 256
    for text in ("Here is the response from the GET request:", _fhir_bundle("K", [3.9, 4.1]),
                 "Émile's INR 2.5 → hold warfarin; naïve café"):
        assert len(model.tokenizer(text, truncation=False)["input_ids"]) == wordpieces.count(text) + wordpieces.SPECIAL
    long = _fhir_bundle("K", [3.9, 4.1, 4.4])
    assert wordpieces.count(wordpieces.cut(long, 100)) <= 101  # the "…" it appends is one piece
