"""SkeMex (seed 001) on the sim backbone: lifecycle, retrieval, buffer, utility, governance,
events, determinism, offline mode. Accuracies here are the sim's (an offline stand-in that
follows an injected skill whose trigger overlaps the case and which names an option), never
a clinical measure. Crafted streams use the fast hashing embedder; the example run uses MiniLM.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from grandrounds.app import run_cases
from grandrounds.offline import seed_memory
from grandrounds.handlers.cases import Case
from grandrounds.handlers.policies.config import load_policy
from grandrounds.handlers.policies.skemex import buffer, governance, retrieval
from grandrounds.handlers.policies.skemex.config import SkeMexPolicy
from grandrounds.handlers.policies.skemex.utility import learning_rate
from grandrounds.handlers.runs import RunSpec
from llm_helpers import HashEmbedder
from grandrounds.replay.audit_history import history
from grandrounds.replay.verify import verify_run
from grandrounds.handlers.policies.skemex import events as sk
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.event_types import AgentStep, AnswerGiven
from grandrounds.store.eventstore import EventStore
from grandrounds.store.projection import rebuild
from grandrounds.handlers.policies.skemex.memory import SkillMemory

from conftest import EXAMPLES

NONE_ACCURACY = 0.115  # `--policy none` on examples/cases.jsonl with sim


def _hash_run(store, cases, policy, run_id, **kw):
    return run_cases(store, cases, RunSpec(policy=policy, seed=0, **kw), run_id=run_id,
                     cache=EmbeddingCache(HashEmbedder(), store.conn))


def _events(store, run_id, type_):
    return [e.decode() for e in store.iter(run_id) if e.type == type_]


def _mcq(case_id, question, options, answer, category="testcat"):
    return Case(case_id=case_id, kind="mcq", question=question, options=options, answer=answer, category=category)


# --- crafted streams ----------------------------------------------------------------------------
# A "trap" option shares words with the question, so the sim's lexical fallback picks it (wrong)
# until a skill naming the right option is in memory. Unique filler cases keep the category's
# reward baseline near 0.5: trap fillers fail, `easy` fillers succeed by lexical overlap.

WORDS = ("amber basalt cobalt dune ember fjord garnet harbor indigo jasper kelp lagoon marble nectar onyx "
         "pewter quartz russet sable tundra umber velvet willow xenon yarrow zephyr").split()


def _filler(i: int, easy: bool) -> Case:
    w = [f"{WORDS[(i * 7 + k) % len(WORDS)]}{i}x{k}" for k in range(5)]
    q = f"Consider {' '.join(w)} presentation."
    opts = {"A": f"{w[0]} {w[1]} picture", "B": f"plain choice {i} one", "C": f"plain choice {i} two"}
    return _mcq(f"fill-{i}", q, opts, "A" if easy else "B")


def _helpful_stream(n_windows: int) -> list[Case]:
    """Pattern P (gold B, trap A), repeated; each window = [P, trap filler, P, easy filler]."""
    opts = {"A": "Glomerular sclerosis variant", "B": "Hyperviscosity crisis", "C": "Benign positional vertigo"}
    out, f = [], 0
    for w in range(n_windows):
        for j in range(2):
            k = 2 * w + j
            out.append(_mcq(f"p-{k}", f"Glomerular sclerosis with retinal venous engorgement and mucosal bleeding, "
                                      f"serum viscosity elevated (instance {k}).", opts, "B"))
            out.append(_filler(f, easy=j == 1))
            f += 1
    return out


def _harmful_stream(n_windows: int) -> list[Case]:
    """Q0 teaches 'favour B'; later cases share Q0's first four key terms but their gold is C, so the
    sim follows the (now misleading) skill. Each later window = [Q, Q, Q, easy filler]."""
    opts = {"A": "Tamponade physiology", "B": "Pericardial effusion drainage", "C": "Constrictive pericarditis"}
    out = [_mcq("q-0", "Kussmaul pulsus tamponade physiology jugular ascites hepatomegaly knock.", opts, "B"),
           _filler(100, easy=True), _filler(101, easy=False), _filler(102, easy=True)]
    uniq = iter(f"{WORDS[k % len(WORDS)]}{k}z" for k in range(1000))
    for w in range(1, n_windows):
        for j in range(3):
            extra = " ".join(next(uniq) for _ in range(8))
            out.append(_mcq(f"q-{w}-{j}", f"Kussmaul pulsus tamponade physiology {extra}.", opts, "C"))
        out.append(_filler(200 + w, easy=True))
    return out


def test_a_skill_whose_adoption_precedes_successes_gains_utility_and_matures():
    store = EventStore(":memory:")
    cfg = SkeMexPolicy(window=4, governance_every=1, mature_min_usage=6, merging=False)
    _hash_run(store, _helpful_stream(8), cfg, "help")
    drafted = {d.skill_id: d for d in _events(store, "help", "skill.drafted")}
    skill_id = next(i for i, d in drafted.items() if d.source_case_id == "p-0")
    assert "Hyperviscosity crisis" in drafted[skill_id].body.core_action
    ups = [u for u in _events(store, "help", "skill.utility_updated") if u.skill_id == skill_id]
    assert ups and all(u.adopted_pos > 0 and u.adopted_neg == 0 for u in ups)
    values = [ups[0].old] + [u.new for u in ups]
    assert values[0] == 0.5 and all(b > a for a, b in zip(values, values[1:]))  # every window it rises
    # η follows the adoption count before each update: 0.05 at first, warming up
    assert ups[0].lr == 0.05 and ups[1].lr == round(learning_rate(ups[0].adopted_pos, cfg), 6) > 0.05
    matured = [m for m in _events(store, "help", "skill.matured") if m.skill_id == skill_id]
    assert len(matured) == 1 and matured[0].utility >= 0.75 and matured[0].usage >= 6
    # the adoption is visible as the answer's source, and the life is in `audit history`
    answers = {e.case_id: e.decode() for e in store.iter("help") if e.type == "answer.given"}
    assert answers["p-2"].source == f"skill:{skill_id}"
    life = history(store, "help", skill_id)
    kinds = [e["event"] for e in life["events"]]
    assert kinds[:2] == ["created", "activated"] and "matured" in kinds and life["summary"]["status"] == "mature"
    assert life["summary"]["followed_correct"] >= 10 and life["utility"][-1]["utility"] == life["summary"]["utility_now"]
    # the live fold equals a rebuild from the log
    proj = rebuild(store, "help", EmbeddingCache(HashEmbedder(), store.conn))
    assert proj.state.policy_memory == _run_memory(store, "help")


def _run_memory(store, run_id):
    return rebuild(store, run_id, EmbeddingCache(HashEmbedder(), store.conn)).state.policy_memory


def test_a_skill_whose_adoption_precedes_failures_is_deprecated_at_the_next_governance_pass():
    store = EventStore(":memory:")
    cfg = SkeMexPolicy(window=4, governance_every=1, merging=False, memory_min_subjects=1)  # (the k-subjects gate: own tests)
    _hash_run(store, _harmful_stream(8), cfg, "harm")
    skill_id = next(d.skill_id for d in _events(store, "harm", "skill.drafted") if d.source_case_id == "q-0")
    ups = [u for u in _events(store, "harm", "skill.utility_updated") if u.skill_id == skill_id]
    assert ups and all(u.adopted_neg > 0 and u.adopted_pos == 0 for u in ups)
    # adopted−: −(λ− + λ_harm·max(0, −A)) per adoption, averaged over the window
    u = ups[1]
    expect = sum(-(0.1 + 0.5 * max(0.0, -a)) for a in u.advantages) / len(u.advantages)
    assert u.mean_delta == pytest.approx(expect, abs=1e-6)
    assert u.new == pytest.approx(max(0.0, u.old + u.lr * u.mean_delta), abs=1e-6)
    crossed = next(x for x in ups if x.new < 0.3)
    dep = [d for d in _events(store, "harm", "skill.deprecated") if d.skill_id == skill_id]
    assert len(dep) == 1 and dep[0].window == crossed.window  # the pass right after that window
    seqs = {e.seq: e.decode() for e in store.iter("harm")}
    dep_seq = next(s for s, p in seqs.items() if isinstance(p, sk.SkillDeprecated))
    # after deprecation it is never retrieved again
    later = [p for s, p in seqs.items() if s > dep_seq and p.event_type == "memory.retrieved"]
    assert later and all(skill_id not in {i.item_id for i in p.items} for p in later)
    assert history(store, "harm", skill_id)["summary"]["status"] == "deprecated"


# --- governance and retrieval on a hand-built repository ----------------------------------------


def _unit(seed: int, dim: int = 64) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


class _Repo:
    """A SkillMemory folded from hand-written events, each skill embedded as a chosen vector."""

    def __init__(self, dim: int = 64):
        self.mem = SkillMemory(dim)
        self.vecs: dict[str, np.ndarray] = {}
        self.seq = 0

    def embed(self, text):
        return self.vecs[text]

    def apply(self, payload):
        self.mem.apply(self.seq, payload, self.embed)
        self.seq += 1

    def add(self, branch, vec, category=None, tool=None, utility=0.5, source="src", required=(), status="active"):
        sid = self.mem.next_id(branch)
        body = sk.SkillBody(name=sid, description=f"when {sid}", applicable_conditions="c",
                            core_action=f"do {sid} carefully", trigger=[sid], required_tools=list(required))
        from grandrounds.handlers.policies.skemex.memory import skill_key_text

        self.vecs[skill_key_text(body)] = vec
        self.apply(sk.SkillDrafted(skill_id=sid, branch=branch, category=category, tool=tool, body=body,
                                   utility=utility, source_case_id=source))
        self.apply(sk.SkillReviewed(skill_id=sid, kind="create", accepted=True, reason="ok", source_case_id=source))
        if status == "mature":
            self.apply(sk.SkillMatured(skill_id=sid, utility=utility, usage=20, window=0))
        elif status == "deprecated":
            self.apply(sk.SkillDeprecated(skill_id=sid, utility=utility, window=0, reason="low"))
        return sid

    def adopt(self, sid, window, pos=1):
        s = self.mem.skills[sid]
        self.apply(sk.SkillUtilityUpdated(skill_id=sid, window=window, old=s.utility, new=s.utility, lr=0.0,
                                          mean_delta=0.0, adopted_pos=pos, adopted_neg=0, advantages=[]))


def _near(v: np.ndarray, eps: float, seed: int) -> np.ndarray:
    w = v + eps * _unit(seed, len(v))
    return (w / np.linalg.norm(w)).astype(np.float32)


def _at_cosine(q: np.ndarray, cos: float, seed: int) -> np.ndarray:
    """A unit vector at exactly this cosine to unit vector q."""
    o = _unit(seed, len(q))
    o = o - float(o @ q) * q
    o /= np.linalg.norm(o)
    return (cos * q + math.sqrt(1 - cos * cos) * o).astype(np.float32)


def test_near_duplicates_merge_into_the_better_skill_within_a_bucket_only():
    r = _Repo()
    base = _unit(1)
    a = r.add("task", base, category="x", utility=0.6, source="c1")
    b = r.add("task", _near(base, 0.2, 2), category="x", utility=0.4, source="c2")  # cosine ≈ 0.98
    c = r.add("task", _unit(3), category="x", source="c3")                         # unrelated
    d = r.add("task", _near(base, 0.2, 4), category="y", source="c4")               # same text, other category
    plan = governance.plan(r.mem, SkeMexPolicy())
    assert [(k.skill_id, g.skill_id) for k, g, _ in plan.merged] == [(a, b)]
    assert plan.merged[0][2] >= 0.8
    r.apply(sk.SkillMerged(kept=a, absorbed=b, cosine=round(plan.merged[0][2], 6), window=1))
    assert r.mem.skills[b].status == "archived" and r.mem.skills[b].merged_into == a
    assert r.mem.skills[a].derived_from == ["c1", "c2"]  # provenance (and the leakage guard) carries over
    assert r.mem.skills[c].status == r.mem.skills[d].status == "active"
    assert governance.plan(r.mem, SkeMexPolicy(merging=False)).merged == []


def test_capacity_evicts_deprecated_then_active_by_utility_then_mature_last():
    r = _Repo()
    ids = {}
    ids["mature_low"] = r.add("task", _unit(10), category="x", utility=0.76, status="mature")
    ids["active_mid"] = r.add("task", _unit(11), category="x", utility=0.5)
    ids["active_old_same"] = r.add("task", _unit(12), category="x", utility=0.4)
    ids["active_new_same"] = r.add("task", _unit(13), category="x", utility=0.4)
    ids["deprecated"] = r.add("task", _unit(14), category="x", utility=0.9, status="deprecated")
    ids["other_cat"] = r.add("task", _unit(15), category="y", utility=0.1)
    r.adopt(ids["active_old_same"], window=3)   # adopted more recently than active_new_same
    cfg = SkeMexPolicy(capacity_task=2, merging=False, deprecation=False, maturation=False)
    evicted = [s.skill_id for s in governance.plan(r.mem, cfg).archived]
    # 5 held in task:x, capacity 2: the deprecated one (despite U 0.9), then the lowest-utility active
    # (ties: least recently adopted first), then the next active; the mature one stays.
    assert evicted == [ids["deprecated"], ids["active_new_same"], ids["active_old_same"]]
    all_x = [s.skill_id for s in governance.plan(r.mem, cfg.model_copy(update={"capacity_task": 0})).archived
             if s.category == "x"]
    assert all_x[-1] == ids["mature_low"] and len(all_x) == 5
    assert governance.plan(r.mem, cfg.model_copy(update={"capacity": False})).archived == []


def test_memory_strength_decays_with_windows_since_last_adoption():
    r = _Repo()
    cfg = SkeMexPolicy()
    sid = r.add("general", _unit(20))
    skill = r.mem.skills[sid]
    assert retrieval.strength(skill, 5, cfg) == 0.0  # never adopted
    r.adopt(sid, window=2, pos=4)                     # 4 successes: τ = 4·(1 + 2) = 12
    values = [retrieval.strength(skill, w, cfg) for w in (2, 3, 6, 14)]
    assert values == pytest.approx([1.0, math.exp(-1 / 12), math.exp(-4 / 12), math.exp(-12 / 12)])
    assert all(a > b for a, b in zip(values, values[1:]))
    r.adopt(sid, window=2, pos=100)                   # τ capped at 20
    assert retrieval.strength(skill, 22, cfg) == pytest.approx(math.exp(-1.0))
    # and it enters the score with weight 0.2; mature ×1.1
    score, s = retrieval.skill_score(0.5, skill, 22, cfg)
    assert score == pytest.approx(0.4 * 0.5 + 0.4 * skill.utility + 0.2 * s)


def test_retrieval_honours_filters_branch_quotas_and_the_leakage_guard():
    r = _Repo()
    q = _unit(30)
    close = lambda k: _at_cosine(q, 0.9 - 0.05 * k, 100 + k)  # noqa: E731  decreasing similarity with k
    g = [r.add("general", close(k), utility=0.9) for k in range(3)]          # the three best scores
    t = [r.add("task", close(3 + k), category="x") for k in range(3)]
    other_cat = r.add("task", close(0), category="y", utility=1.0)
    a = [r.add("action", close(6 + k), tool="t1", required=["t1"]) for k in range(2)]
    needs_t2 = r.add("general", close(0), utility=1.0, required=["t2"])
    own = r.add("task", close(0), category="x", utility=1.0, source="case-1")
    far = r.add("general", _unit(31), utility=1.0)                              # cosine < 0.2
    cfg = SkeMexPolicy()
    pool = retrieval.candidates(r.mem, cfg, "case-1", "x", ["t1"], q)
    ids = {c.skill.skill_id for c in pool}
    assert other_cat not in ids and needs_t2 not in ids and own not in ids and far not in ids
    assert all(c.similarity >= 0.2 for c in pool)
    chosen = [c.skill.skill_id for c in retrieval.select(pool, cfg)]
    # quota: 2 per branch first, so the third general skill (scoring higher than the tasks) waits
    assert len(chosen) == 6 and set(chosen) == {g[0], g[1], t[0], t[1], a[0], a[1]}
    scores = [c.score for c in retrieval.select(pool, cfg)]
    assert scores == sorted(scores, reverse=True)
    # with a larger budget the remaining slots go to the best remaining, not by branch
    chosen8 = [c.skill.skill_id for c in retrieval.select(pool, cfg.model_copy(update={"top_k": 8}))]
    assert set(chosen8) == {*g, *t, *a}
    # without the tool, action-level skills are not candidates; another case sees `own`
    assert not {c.skill.branch for c in retrieval.candidates(r.mem, cfg, "case-2", "x", [], q)} & {"action"}
    assert own in {c.skill.skill_id for c in retrieval.candidates(r.mem, cfg, "case-2", "x", [], q)}


# --- the learning buffer -------------------------------------------------------------------------


def _answer(steps, source="lexical"):
    return AnswerGiven(answer="A", source=source, steps=[AgentStep(kind=k, content=c) for k, c in steps])


def test_buffer_gating_drops_simple_successes_loops_max_step_failures_and_infra_errors():
    cfg = SkeMexPolicy()
    simple = _answer([("reasoning", "r"), ("response", "A")])
    assert buffer.drop_reason(simple, 1.0, cfg) == "simple-success"
    assert buffer.drop_reason(simple, 0.0, cfg) is None                      # a quick failure is kept
    two_tools = _answer([("tool", "x"), ("observation", "x -> A"), ("tool", "y"), ("observation", "y -> A"),
                         ("response", "A")])
    assert buffer.turns(two_tools.steps) == 3 and buffer.drop_reason(two_tools, 1.0, cfg) is None
    loop = _answer([("tool", "x"), ("observation", "o"), ("tool", "x"), ("observation", "o"), ("tool", "x"),
                    ("observation", "o"), ("response", "A")])
    assert buffer.drop_reason(loop, 0.0, cfg) == "loop"
    not_loop = _answer([("tool", "x"), ("observation", "o"), ("tool", "y"), ("observation", "o"), ("tool", "x"),
                        ("observation", "o"), ("response", "A")])
    assert buffer.drop_reason(not_loop, 0.0, cfg) is None
    long_fail = _answer([s for k in range(6) for s in (("tool", f"t{k}"), ("observation", "o"))])
    assert buffer.drop_reason(long_fail, 0.0, cfg) == "max-steps"
    assert buffer.drop_reason(_answer([("reasoning", "r")], source="llm:fallback"), 0.0, cfg) == "max-steps"
    infra = _answer([("tool", "x"), ("observation", "x -> error: service unavailable"), ("response", "A")])
    assert buffer.drop_reason(infra, 1.0, cfg) == "infra-error"


def test_the_window_distils_at_most_capacity_failures_first_and_feeds_every_trajectory_to_utility():
    store = EventStore(":memory:")
    cases = [_filler(300 + i, easy=i % 3 == 0) for i in range(12)]
    _hash_run(store, cases, SkeMexPolicy(window=6, buffer_capacity=2), "buf")
    recorded = _events(store, "buf", "skill.trajectory_recorded")
    assert len(recorded) == 12
    assert {t.drop_reason for t in recorded if t.reward == 1.0} == {"simple-success"}
    assert all(t.retained for t in recorded if t.reward == 0.0)
    closed = _events(store, "buf", "skill.window_closed")
    assert [c.window for c in closed] == [0, 1] and all(len(c.cases) == 6 for c in closed)
    first_failures = [t.case_id for t in recorded[:6] if t.reward == 0.0]
    assert closed[0].distilled == first_failures[:2] and closed[0].over_capacity == first_failures[2:]
    assert len(_events(store, "buf", "skill.trajectory_assessed")) == 4
    b, n = closed[0].baselines["testcat"]
    assert n == 6 and 0.0 < b < 0.5  # EMA from the 0.5 prior over 2 successes and 4 failures


# --- the example stream, determinism, presets, offline mode ---------------------------------------


def test_the_preset_file_equals_the_class_defaults():
    import tomllib

    from grandrounds.handlers.policies.config import PRESET_DIR

    data = tomllib.loads((PRESET_DIR / "skemex.toml").read_text(encoding="utf-8"))
    assert set(data) == set(SkeMexPolicy().model_dump(mode="json"))  # every parameter spelled out
    assert load_policy("skemex") == SkeMexPolicy()
    for name, fields in SkeMexPolicy.ablations.items():
        assert set(fields) <= set(SkeMexPolicy.model_fields), name


@pytest.fixture(scope="module")
def example_db(tmp_path_factory):
    from grandrounds.handlers.cases import load_cases

    path = tmp_path_factory.mktemp("skemex") / "ex.duckdb"
    cases = load_cases(EXAMPLES)[0]
    with EventStore(path) as store:
        out = run_cases(store, cases, RunSpec(policy=SkeMexPolicy(), seed=0), run_id="skx",
                        cache=EmbeddingCache(shared_minilm(), store.conn))
    return path, out.summary


def test_the_example_run_learns_and_verify_re_executes_it_identically(example_db):
    path, summary = example_db
    # sim backbone, MiniLM embeddings: 0.500 observed (none: 0.115, evo-medagent 0.718). The sim only
    # follows skills, so this measures retrieval/valuation plumbing, not clinical accuracy.
    assert summary["accuracy"] >= NONE_ACCURACY + 0.3
    assert summary["memory"]["skill_windows_closed"] == 2 and summary["memory"]["skills"]["active"] >= 20
    with EventStore(path) as store:
        res = verify_run(store, "skx", EmbeddingCache(shared_minilm(), store.conn))
        assert res.identical and res.ok, res.first_divergence
        assert len(_events(store, "skx", "skill.governed")) == 1  # 2 windows, governance every 2


def test_offline_mode_trains_on_half_then_answers_the_other_half_from_a_frozen_repository():
    from grandrounds.handlers.cases import load_cases

    cases = load_cases(EXAMPLES)[0]
    train, test = cases[::2], cases[1::2]
    store = EventStore(":memory:")
    cfg = SkeMexPolicy(window=10)
    _hash_run(store, train, cfg, "train")
    trained = _run_memory(store, "train")
    live = {s.skill_id for s in trained.skills.values() if s.live}
    assert live
    frozen = cfg.model_copy(update={"writing": False})
    spec = RunSpec(policy=frozen, seed=0)
    source, seeded = seed_memory(store, None, "train", spec)
    out = run_cases(store, test, spec.model_copy(update={"memory_from": source}), run_id="test",
                    cache=EmbeddingCache(HashEmbedder(), store.conn), seeded=seeded)
    types = [e.type for e in store.iter("test")]
    assert not [t for t in types if t.startswith("skill.")]  # frozen: nothing written
    answers = [e.decode() for e in store.iter("test") if e.type == "answer.given"]
    used = {a.source.removeprefix("skill:") for a in answers if a.source.startswith("skill:")}
    assert used and used <= live
    view = lambda m: {i: (s.status, s.utility, s.body, s.derived_from) for i, s in m.skills.items()}  # noqa: E731
    assert view(_run_memory(store, "test")) == view(trained)  # seqs differ (seeded events fold at seq < 0)
    none = _hash_run(store, test, load_policy("none"), "test-none")
    assert out.summary["accuracy"] > none.summary["accuracy"]
