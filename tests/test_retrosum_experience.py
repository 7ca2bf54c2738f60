"""RetroSum's experience bank: lessons stored with their patient context, top-1 retrieval at
cosine ≥ 0.5 with the leakage guard, actor lessons to the actor and summariser lessons to the
summariser (fake OpenAI server), verify, the preset, learning with sim, and offline mode
across backbones."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import EXAMPLES, run_in, copy_db
from fake_openai_server import FakeOpenAI
from grandrounds.app import run_cases
from grandrounds.cli import main
from grandrounds.offline import seed_memory
from grandrounds.handlers.cases import Case, load_cases
from grandrounds.handlers.policies.base import SUMMARISER
from grandrounds.handlers.policies.config import PRESET_DIR, NoMemoryPolicy, load_policy, with_ablations
from grandrounds.handlers.policies.retrosum.config import RetroSumPolicy
from grandrounds.handlers.policies.retrosum.lessons import SYSTEM as LESSON_SYSTEM, patient_context
from grandrounds.handlers.policies.retrosum.policy import RetroSumMemory
from grandrounds.handlers.runs import RunSpec
from grandrounds.handlers.text import key_terms
from llm_helpers import MODEL, HashEmbedder, live_options
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.event_types import RunStarted
from grandrounds.store.eventstore import EventStore
from grandrounds.handlers.policies.retrosum.events import ExperienceStored, Lesson
from grandrounds.handlers.policies.retrosum.memory import ExperienceMemory
from grandrounds.store.projection import MemoryProjection

NONE_ACCURACY = 0.115385  # `--policy none` on the examples with sim
OBSERVED_MARGIN = 0.3  # retrosum measured 0.448718 (35/78), i.e. +0.333 over none (0.653846 before
# answer_lessons_floor withheld answer-naming lessons of less similar presentations)


def _payloads(store, run_id, type_):
    return [(e.case_id, e.payload) for e in store.iter(run_id, types=[type_])]


# --- config -------------------------------------------------------------------------------


def test_the_preset_file_spells_out_every_parameter_at_the_class_defaults():
    preset = load_policy("retrosum")
    assert preset == RetroSumPolicy()
    keys = set(tomllib.loads((PRESET_DIR / "retrosum.toml").read_text()))
    assert keys == set(RetroSumPolicy.model_fields)
    assert (preset.top_k, preset.min_similarity) == (1, 0.5)
    for name in RetroSumPolicy.ablations:
        with_ablations(preset, [name])  # each switch validates
    assert with_ablations(preset, ["no-summariser-lessons"]).summariser_lessons is False


# --- retrieval on a hand-built bank ----------------------------------------------------------


class VectorTable:
    """An embedder that returns the vector a test assigned to a text."""

    name = "table-3"
    dim = 3

    def __init__(self, table: dict[str, np.ndarray]):
        self.table = table

    def embed_one(self, text: str) -> np.ndarray:
        return self.table[text]


def _unit(cos: float) -> np.ndarray:
    """A unit vector whose cosine with (1, 0, 0) is `cos`."""
    return np.array([cos, np.sqrt(1 - cos * cos), 0.0], dtype=np.float32)


def _qcos(cos: float) -> float:
    """The cosine memory computes for `_unit(cos)` against the query: of the int8 vectors it holds
    (store/vectors.py), within ~0.005 of `cos`."""
    from grandrounds.store.vectors import cosine, exact, quantize

    return cosine(exact(quantize(_unit(1.0))), exact(quantize(_unit(cos))))


def _case(case_id: str, question: str) -> Case:
    return Case(case_id=case_id, kind="mcq", question=question, options={"A": "alpha", "B": "beta"}, answer="A")


def _experience(i: int, case_id: str, context: str) -> ExperienceStored:
    return ExperienceStored(experience_id=f"exp-{i:05d}", source_case_id=case_id, context=context,
                            actor_lessons=[Lesson(text=f"actor lesson {i}: favour 'alpha'.", trigger=["fever"])],
                            summariser_lessons=[Lesson(text=f"summariser lesson {i}")], answer="B", gold="A",
                            correct=False)


def _bank(contexts: list[tuple[str, str, float]], policy: RetroSumPolicy = RetroSumPolicy()):
    """A projection holding one experience per (case_id, context, cosine to the query)."""
    table = {"the query": _unit(1.0)}
    table.update({ctx: _unit(cos) for _, ctx, cos in contexts})
    store = EventStore(":memory:")
    proj = MemoryProjection(3).bind(EmbeddingCache(VectorTable(table), store.conn))
    proj.apply(0, RunStarted(policy_name="retrosum", policy=policy.model_dump(mode="json"), backbone="sim",
                             seed=0, embedder="table-3"))
    for i, (case_id, ctx, _) in enumerate(contexts):
        proj.apply(i + 1, _experience(i, case_id, ctx))
    # A bare context: these texts name no one, so retrieval reads them as they are.
    return SimpleNamespace(projection=proj, retrieval_text=lambda text, case_id: text), store


def test_experiences_are_keyed_by_the_embedding_of_their_patient_context():
    ctx, store = _bank([("c1", "ctx one", 0.7), ("c2", "ctx two", 0.2)])
    part = ctx.projection.state.policy_memory
    assert isinstance(part, ExperienceMemory) and len(part) == 2
    from grandrounds.store.vectors import exact, quantize

    assert np.array_equal(part.index.vector(0), exact(quantize(_unit(0.7))))
    assert np.array_equal(part.index.vector(1), exact(quantize(_unit(0.2))))
    assert part.counts() == {"experiences": 2, "actor_lessons": 2, "summariser_lessons": 2}
    assert ExperienceStored.carries_memory  # offline mode copies it
    store.close()


# int8 vectors: _unit(0.506)'s cosine to the query is 0.5087, _unit(0.49)'s 0.4903 (`_qcos`)
@pytest.mark.parametrize("cos, retrieved", [(0.49, False), (0.506, True), (0.51, True)])
def test_top1_retrieval_respects_the_cosine_threshold(cos, retrieved):
    ctx, store = _bank([("c1", "near", cos), ("c2", "far", 0.1)])
    policy = RetroSumPolicy(answer_lessons_floor=-1.0)  # the lesson names option A: shown at any cosine here
    got = RetroSumMemory(policy).retrieve(ctx, _case("new", "the query"), ctx.projection.seq)
    store.close()
    if not retrieved:  # below 0.5: nothing injected anywhere
        assert got.items == [] and "Lessons from a similar past case" not in got.prefix
        return
    assert {i.detail["experience_id"] for i in got.items} == {"exp-00000"}  # top-1 only: "far" never comes
    assert _qcos(cos) >= 0.5 and all(i.kind == "experience" and abs(i.relevance - _qcos(cos)) < 1e-6 for i in got.items)
    actor = [i for i in got.items if i.detail["audience"] != SUMMARISER]
    summ = [i for i in got.items if i.detail["audience"] == SUMMARISER]
    assert [i.text for i in actor] == ["actor lesson 0: favour 'alpha'."] and actor[0].trigger == ["fever"]
    assert [i.text for i in summ] == ["summariser lesson 0"] and summ[0].trigger == []
    assert "actor lesson 0" in got.prefix and "summariser lesson 0" not in got.prefix


@pytest.mark.parametrize("cos", [0.6, 0.69])
def test_below_the_answer_floor_a_lesson_naming_an_option_is_withheld(cos):
    """Issue 20: a past case's lesson that names one of this case's options acted as the answer for the
    local model. Below `answer_lessons_floor` (0.7) only lessons naming none are shown; with none left
    the actor's prompt is `none`'s (no lessons heading). Summariser lessons are not the actor's."""
    ctx, store = _bank([("c1", "near", cos)])
    part = ctx.projection.state.policy_memory
    mem = RetroSumMemory(RetroSumPolicy())
    got = mem.retrieve(ctx, _case("new", "the query"), ctx.projection.seq)
    assert [i.detail["audience"] for i in got.items] == [SUMMARISER]
    assert "Lessons from a similar past case" not in got.prefix
    at_floor = RetroSumMemory(RetroSumPolicy(answer_lessons_floor=_qcos(cos) - 1e-3))
    shown = at_floor.retrieve(ctx, _case("new", "the query"), ctx.projection.seq)
    assert "actor lesson 0: favour 'alpha'." in shown.prefix
    generic = Lesson(text="Weigh every finding before you settle.", trigger=[])
    ctx.projection.apply(ctx.projection.seq + 1, ExperienceStored(
        experience_id="exp-00001", source_case_id="c2", context="near", actor_lessons=[generic],
        summariser_lessons=[], answer="A", gold="A", correct=True))
    both = RetroSumMemory(RetroSumPolicy(top_k=2)).retrieve(ctx, _case("new", "the query"), ctx.projection.seq)
    store.close()
    assert len(part) == 2 and "Weigh every finding" in both.prefix and "alpha" not in both.prefix


@pytest.mark.parametrize("text, named", [("Favour alpha here.", True), ("Option B fits.", True),
                                         ("The gamma sign decides.", False), ("The query decides.", False)])
def test_what_counts_as_naming_an_option(text, named):
    from grandrounds.handlers.policies.retrosum.policy import names_an_option
    from grandrounds.store.event_types import MemoryItem

    item = MemoryItem(kind="experience", item_id="x", text=text, detail={"audience": "actor"})
    assert names_an_option(item, _case("new", "the query")) is named


def test_lessons_that_teach_another_option_are_not_stored():
    """Issue 20: after a wrong answer the local model restated the lesson it had been shown, of another
    diagnosis; such a lesson, and one that only rules options out by name, never becomes memory."""
    from grandrounds.handlers.policies.retrosum.lessons import LessonDraft
    from grandrounds.handlers.policies.retrosum.policy import reviewed

    case = Case(case_id="c", kind="mcq", question="Sharp chest pain eased by leaning forward; diffuse ST elevation.",
                options={"A": "Tension pneumothorax", "B": "Acute pericarditis", "C": "Aortic dissection"}, answer="B")
    drafts = [LessonDraft(text="A silent hyperresonant side suggests a tension pneumothorax."),
              LessonDraft(text="Tension pneumothorax and aortic dissection do not fit these symptoms."),
              LessonDraft(text="Pain relieved by leaning forward with diffuse ST elevation points to acute pericarditis."),
              LessonDraft(text="Weigh the finding that separates close alternatives before answering.")]
    kept = [d.text for d in reviewed(drafts, case, RetroSumPolicy())]
    assert kept == [drafts[2].text, drafts[3].text]
    assert len(reviewed(drafts, case, RetroSumPolicy(review_lessons=False))) == 4


def test_a_case_never_retrieves_an_experience_derived_from_itself():
    # Its own experiences are the nearest (two of them, as after a keep-learning rerun); the guard
    # skips both and still returns the best experience of another case.
    ctx, store = _bank([("self", "own a", 1.0), ("other", "other", 0.8), ("self", "own b", 0.99)])
    got = RetroSumMemory(RetroSumPolicy()).retrieve(ctx, _case("self", "the query"), ctx.projection.seq)
    alone, _ = _bank([("self", "own", 1.0)])
    nothing = RetroSumMemory(RetroSumPolicy()).retrieve(alone, _case("self", "the query"), alone.projection.seq)
    store.close()
    assert {i.detail["source_case_id"] for i in got.items} == {"other"}
    assert nothing.items == []


def test_ablations_withhold_one_audience():
    ctx, store = _bank([("c1", "near", 0.9)])
    case = _case("new", "the query")
    no_actor = RetroSumMemory(RetroSumPolicy(actor_lessons=False)).retrieve(ctx, case, 1)
    no_summ = RetroSumMemory(RetroSumPolicy(summariser_lessons=False)).retrieve(ctx, case, 1)
    store.close()
    assert {i.detail["audience"] for i in no_actor.items} == {SUMMARISER} and "actor lesson" not in no_actor.prefix
    assert {i.detail["audience"] for i in no_summ.items} == {"actor"}


# --- the example run with sim --------------------------------------------------------------


@pytest.fixture(scope="module")
def example_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("retrosum") / "runs.duckdb"
    cases = load_cases(EXAMPLES)[0]
    with EventStore(db) as store:
        # Without the k-subjects gate (memory_min_subjects=1; it has its own tests in test_privacy_freetext.py):
        # these tests check how lessons are keyed and stored, which the gate's withheld words would hide.
        ctx = run_in(store, cases, RunSpec(policy=RetroSumPolicy(memory_min_subjects=1), seed=0), "rs", declare=True)
        run_in(store, cases, RunSpec(policy=NoMemoryPolicy(), seed=0), "none", declare=True)
        counts = ctx.projection.state.counts()
    return db, cases, counts


def _accuracy(store, run_id):
    done = [p["correct"] for _, p in _payloads(store, run_id, "case.completed")]
    return round(sum(done) / len(done), 6)


def test_the_example_run_learns_well_above_the_memory_free_baseline(example_db):
    db, cases, counts = example_db
    with EventStore(db, read_only=True) as store:
        rs, none = _accuracy(store, "rs"), _accuracy(store, "none")
        sources = [p["source"] for _, p in _payloads(store, "rs", "answer.given")]
    assert none == NONE_ACCURACY
    assert rs >= none + OBSERVED_MARGIN, rs
    followed = [s for s in sources if s.startswith("experience:")]
    assert len(followed) >= 25 and all(re.fullmatch(r"experience:exp-\d{5}-a\d+", s) for s in followed)
    assert counts["experiences"] == len(cases)


def test_lessons_are_stored_as_events_with_the_patient_context(example_db):
    db, cases, _ = example_db
    by_id = {c.case_id: c for c in cases}
    with EventStore(db, read_only=True) as store:
        stored = _payloads(store, "rs", "experience.stored")
    assert len(stored) == len(cases)
    for case_id, p in stored:
        case = by_id[case_id]
        assert p["source_case_id"] == case_id and p["context"] == patient_context(case.question) == case.question
        gold = case.options[case.answer]
        first = p["actor_lessons"][0]
        assert f"favour '{gold}'" in first["text"] and first["trigger"] == key_terms(case.question)
        assert not any(t != gold and f"'{t}'" in first["text"] for t in case.options.values())
        assert p["summariser_lessons"] and all(s["trigger"] == [] for s in p["summariser_lessons"])
        assert p["gold"] == case.answer and len(p["actor_lessons"]) == (1 if p["correct"] else 2)


def test_retrieval_in_the_example_run_honours_threshold_and_guard(example_db):
    db, _, _ = example_db
    with EventStore(db, read_only=True) as store:
        retrieved = _payloads(store, "rs", "memory.retrieved")
    with_items = [(cid, p["items"]) for cid, p in retrieved if p.get("items")]
    assert 50 <= len(with_items) < len(retrieved)  # some cases have no experience at cosine ≥ 0.5
    for case_id, items in with_items:
        assert len({i["detail"]["experience_id"] for i in items}) == 1  # top-1
        assert all(i["relevance"] >= 0.5 and i["detail"]["source_case_id"] != case_id for i in items)


def test_verify_re_executes_a_retrosum_run_identically(example_db, tmp_path):
    db = tmp_path / "copy.duckdb"
    copy_db(example_db[0], db)
    res = CliRunner().invoke(main, ["verify", "--db", str(db), "rs", "--json"])
    out = json.loads(res.stdout)
    assert res.exit_code == 0, res.output
    assert out["identical"] and out["fingerprint"] == out["replayed_fingerprint"] and out["complete"]


def test_offline_mode_trains_then_answers_from_a_frozen_bank(example_db, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    db = tmp_path / "offline.duckdb"
    copy_db(example_db[0], db)  # warm embedding cache
    lines = EXAMPLES.read_text().splitlines()
    (tmp_path / "train.jsonl").write_text("\n".join(lines[:50]) + "\n")
    (tmp_path / "test.jsonl").write_text("\n".join(lines[50:]) + "\n")

    def run(*args):
        res = CliRunner().invoke(main, ["run", *args, "--db", str(db), "--backbone", "sim", "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    train = run(str(tmp_path / "train.jsonl"), "--policy", "retrosum", "--run-id", "train")
    test = run(str(tmp_path / "test.jsonl"), "--policy", "retrosum", "--run-id", "test", "--memory-from", "train")
    with EventStore(db, read_only=True) as store:
        own = _payloads(store, "test", "experience.stored")
        retrieved = [i for _, p in _payloads(store, "test", "memory.retrieved") for i in p.get("items", [])]
        train_ids = {p["source_case_id"] for _, p in _payloads(store, "train", "experience.stored")}
        sources = [p["source"] for _, p in _payloads(store, "test", "answer.given")]
    assert train["memory"]["experiences"] == 50
    assert own == [] and test["memory"]["experiences"] == 50  # frozen: read, never written
    assert retrieved and {i["detail"]["source_case_id"] for i in retrieved} <= train_ids
    assert any(s.startswith("experience:") for s in sources)
    assert test["accuracy"] > NONE_ACCURACY


# --- the openai loop against the fake server ------------------------------------------------

# Four broken turns keep the agent going; step 5 answers. The policy's w = 3 (not the loop's summary_every)
# gives a summary after step 3 and one when the episode ends.
BROKEN = [("act", "bad_json_tool"), ("act", "unknown_tool"), ("act", "no_action"), ("act", "no_action")]
LOOP = {"max_steps": 5, "summary_every": 2}


class LessonServer(FakeOpenAI):
    """The fake server, also playing RetroSum's lesson writer (structured JSON)."""

    def _text(self, kind, messages, action):
        if messages[0]["content"].startswith(LESSON_SYSTEM[:40]):
            gold = re.search(r"correct answer: [A-Z]\) (.+?) \((?:correct|wrong)\)", messages[1]["content"]).group(1)
            return json.dumps({"actor_lessons": [{"text": f"Such a presentation calls for '{gold}'.",
                                                  "trigger": ["Fever", " headache "]}, {"text": "  "}],
                               "summariser_lessons": [{"text": "Keep the exact ESR value.", "trigger": ["x"]}]})
        return super()._text(kind, messages, action)


def _kind(request: dict) -> str:
    system = request["messages"][0]["content"]
    return ("summarise" if system.startswith("You are the retrospective summariser") else
            "lessons" if system.startswith(LESSON_SYSTEM[:40]) else "act")


@pytest.fixture(scope="module")
def cases():
    return {c.case_id: c for c in load_cases(EXAMPLES)[0]}


@pytest.fixture
def sim_bank(cases):
    """A train bank built with the sim backbone (hashing embedder)."""
    store = EventStore(":memory:")
    train = [cases[f"ex-{i:03d}"] for i in range(2, 40)]  # holds ex-016, ex-001's nearest
    run_cases(store, train, RunSpec(policy=RetroSumPolicy(), seed=0), run_id="train",
              cache=EmbeddingCache(HashEmbedder(), store.conn))
    yield store, {c.case_id for c in train}
    store.close()


def _frozen_openai_run(store, cases, policy: RetroSumPolicy, run_id: str, server):
    spec = RunSpec(policy=policy.model_copy(update={"writing": False}), backbone="openai", model=MODEL, seed=0)
    source, seeded = seed_memory(store, None, "train", spec)
    return run_cases(store, cases, spec.model_copy(update={"memory_from": source}), run_id=run_id,
                     cache=EmbeddingCache(HashEmbedder(), store.conn), backbone_options=live_options(server, **LOOP),
                     seeded=seeded)


def test_the_summariser_gets_summariser_lessons_and_the_actor_only_actor_lessons(sim_bank, cases):
    store, _ = sim_bank
    with FakeOpenAI() as server:
        server.script = list(BROKEN)
        out = _frozen_openai_run(store, [cases["ex-001"]], RetroSumPolicy(), "test", server)
        requests = list(server.requests)
    items = _payloads(store, "test", "memory.retrieved")[0][1]["items"]
    actor = [i["text"] for i in items if i["detail"]["audience"] == "actor"]
    summ = [i["text"] for i in items if i["detail"]["audience"] == SUMMARISER]
    assert actor and summ and out.summary["failed"] == 0
    summariser_calls = [r for r in requests if _kind(r) == "summarise"]
    actor_calls = [r for r in requests if _kind(r) == "act"]
    assert len(summariser_calls) == 2 and len(actor_calls) == 5
    for r in summariser_calls:
        prompt = r["messages"][1]["content"]
        assert "## Lessons for the summariser from a similar past case" in prompt
        assert all(f"- {s}" in prompt for s in summ) and not any(a in prompt for a in actor)
    for r in actor_calls:
        text = "\n".join(m["content"] for m in r["messages"])
        assert all(a in text for a in actor) and not any(s in text for s in summ)


def test_without_summariser_lessons_the_summariser_is_not_taught(sim_bank, cases):
    store, _ = sim_bank
    with FakeOpenAI() as server:
        server.script = list(BROKEN)
        _frozen_openai_run(store, [cases["ex-001"]], RetroSumPolicy(summariser_lessons=False), "ablated", server)
        requests = list(server.requests)
    summariser_calls = [r for r in requests if _kind(r) == "summarise"]
    assert summariser_calls and all("Lessons for the summariser" not in r["messages"][1]["content"]
                                    for r in summariser_calls)
    assert "Lessons from a similar past case" in requests[0]["messages"][1]["content"]


def test_a_sim_built_bank_serves_an_openai_run_with_the_leakage_guard(sim_bank, cases):
    store, train_ids = sim_bank
    test = [cases["ex-001"], cases["ex-016"]]  # ex-016 is also in the train split
    with FakeOpenAI() as server:
        out = _frozen_openai_run(store, test, RetroSumPolicy(), "cross", server)
    retrieved = dict(_payloads(store, "cross", "memory.retrieved"))
    started = next(store.iter("cross", types=["run.started"])).payload
    assert started["backbone"] == "openai" and out.summary["cases"] == 2
    assert _payloads(store, "cross", "experience.stored") == []
    for case_id in ("ex-001", "ex-016"):
        items = retrieved[case_id]["items"]
        assert items and all(i["relevance"] >= 0.5 for i in items)
        sources = {i["detail"]["source_case_id"] for i in items}
        assert sources <= train_ids and case_id not in sources  # ex-016's own experience is skipped


def test_the_openai_lesson_writer_is_a_recorded_structured_call(cases):
    with LessonServer() as server, EventStore(":memory:") as store:
        # memory_min_subjects=1: two cases are too few subjects for the k-subjects gate to pass "headache"
        run_cases(store, [cases["ex-001"], cases["ex-016"]], RunSpec(policy=RetroSumPolicy(memory_min_subjects=1), backbone="openai",
                                                                   model=MODEL, seed=0),
                  run_id="w", cache=EmbeddingCache(HashEmbedder(), store.conn), backbone_options=live_options(server))
        stored = _payloads(store, "w", "experience.stored")
        exchanges = [p for _, p in _payloads(store, "w", "llm.exchange") if p["purpose"] == "experience-lessons"]
        second = _payloads(store, "w", "memory.retrieved")[1][1]
    assert len(exchanges) == 2 and exchanges[0]["params"]["response_format"]["json_schema"]["name"] == "ExperienceDraft"
    prompt = exchanges[0]["messages"][1]["content"]
    assert "## Agent trajectory" in prompt and "correct answer: B) Begin high-dose glucocorticoids" in prompt
    first = stored[0][1]
    assert first["actor_lessons"] == [{"text": "Such a presentation calls for 'Begin high-dose glucocorticoids "
                                               "immediately'.", "trigger": ["fever", "headache"]}]
    assert first["summariser_lessons"] == [{"text": "Keep the exact ESR value.", "trigger": []}]
    assert {i["detail"]["source_case_id"] for i in second["items"]} == {"ex-001"}
