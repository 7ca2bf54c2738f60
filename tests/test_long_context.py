"""The `long-context` baseline (issue 32, item 7): the most recent past cases and their outcomes in the
prompt, newest first, within a token budget, under every rule the memory policies obey (the leakage
guard by id and by content, gold only after feedback, de-identification across patients, determinism)."""

from __future__ import annotations

import json

from click.testing import CliRunner

import freetext_leaks
from grandrounds.app import run_cases
from grandrounds.cli import main
from grandrounds.handlers.cases import Case
from grandrounds.handlers.policies.config import load_policy
from grandrounds.handlers.policies.long_context.config import LongContextPolicy
from grandrounds.handlers.policies.long_context.memory import PastCase, RecentCases
from grandrounds.handlers.policies.long_context.policy import SECTION, case_line, select
from grandrounds.handlers.policies.render import render_prefix
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore
from grandrounds.store.projection import rebuild
from grandrounds.store.safe_codec import decode, encode
from llm_helpers import HashEmbedder
from tests.conftest import EXAMPLES, run_in

FINDINGS = ["fever and neck stiffness", "tearing chest pain radiating to the back", "sudden scrotal pain",
            "migrating periumbilical pain", "halos around lights and a red eye", "jaw claudication",
            "pleuritic pain after a long flight", "polyuria and weight loss", "a painless jaundice",
            "unilateral leg swelling", "a thunderclap headache", "haemoptysis and weight loss"]
OPTIONS = ["Meningitis", "Aortic dissection", "Testicular torsion", "Appendicitis", "Angle-closure glaucoma",
           "Giant cell arteritis", "Pulmonary embolism", "Diabetes mellitus", "Pancreatic cancer",
           "Deep vein thrombosis", "Subarachnoid haemorrhage", "Lung cancer"]


def _cases(n: int = 12) -> list[Case]:
    """Distinct vignettes of different lengths (so the budget cuts at different depths), each with four
    options; the answer's letter moves from case to case."""
    out = []
    for i in range(n):
        opts = [OPTIONS[(i + j) % len(OPTIONS)] for j in range(4)]
        letters = "ABCD"
        gold = letters[i % 4]
        ordered = dict(zip(letters, opts[-(i % 4):] + opts[:-(i % 4)] if i % 4 else opts))
        padding = " The examination is otherwise unremarkable." * (i % 3)
        question = (f"Patient {i} (case {i}) presents with {FINDINGS[i % len(FINDINGS)]}.{padding} "
                    "Which of the following is the most likely diagnosis?")
        out.append(Case(case_id=f"c{i:02d}", kind="mcq", question=question, options=ordered, answer=gold,
                        category="general"))
    return out


def _sim(store: EventStore, cases, policy, rid: str, lag: int = 0):
    spec = RunSpec(policy=policy, backbone="sim", seed=0, lag=lag)
    return run_cases(store, cases, spec, run_id=rid, cache=EmbeddingCache(HashEmbedder(), store.conn))


def _retrieved(store: EventStore, rid: str) -> list:
    return list(store.iter(rid, types=["memory.retrieved"]))


def _section(prefix: str) -> list[str]:
    """The past-case lines of a rendered prefix ([] when it is the memory-free one)."""
    if prefix == render_prefix([], [], []):
        return []
    head, _, body = prefix.partition(SECTION + "\n")
    assert head == render_prefix([], [], []) + "\n", prefix
    return body.split("\n")


# --- the budget ----------------------------------------------------------------------------------


def _past(i: int, words: int) -> PastCase:
    return PastCase(f"ep-{i:05d}", f"p{i}", " ".join(f"w{i}x{k}" for k in range(words)), ["A) One", "B) Two"],
                    "B", "Two", "A", "One", False, [], i)


def test_the_section_is_the_longest_run_of_the_most_recent_cases_that_fits():
    mem = RecentCases()
    for i, words in enumerate([40, 5, 30, 8, 12, 3]):  # p5 is the most recent
        mem.cases[f"ep-{i:05d}"] = _past(i, words)
    cfg = LongContextPolicy(context_tokens=100, chars_per_token=4.0)  # 400 characters
    shown = select(mem, frozenset(), cfg)
    ids = [p.case_id for p, _ in shown]
    newest = ["p5", "p4", "p3", "p2", "p1", "p0"]
    assert ids == newest[:len(ids)] and 1 < len(ids) < 6  # a run from the newest back, cut by the budget
    lines = [line for _, line in shown]
    assert lines == [case_line(n, p) for n, (p, _) in enumerate(shown, 1)]
    assert len("\n".join(lines)) <= 400
    nxt = case_line(len(ids) + 1, mem.cases[f"ep-{6 - len(ids) - 1:05d}"])
    assert len("\n".join([*lines, nxt])) > 400  # the next older case would not have fitted
    # what a line says: question, the case's own options, the agent's answer, right or wrong, the gold
    assert lines[0] == ("- Past case 1: w5x0 w5x1 w5x2 Options: A) One; B) Two. The agent answered B (Two): wrong. "
                        "Confirmed answer: A (One).")
    # the own set is skipped, and the run continues behind it
    assert [p.case_id for p, _ in select(mem, frozenset({"p5"}), cfg)][:2] == ["p4", "p3"]
    assert len(select(mem, frozenset(), cfg.model_copy(update={"max_cases": 2}))) == 2
    assert len(select(mem, frozenset(), cfg.model_copy(update={"context_tokens": 10_000}))) == 6


def test_a_most_recent_case_over_the_budget_is_cut_at_a_word_and_deterministically():
    mem = RecentCases()
    mem.cases["ep-00000"] = _past(0, 10)
    mem.cases["ep-00001"] = big = _past(1, 400)
    cfg = LongContextPolicy(context_tokens=50, chars_per_token=4.0)  # 200 characters
    shown = select(mem, frozenset(), cfg)
    assert [p.case_id for p, _ in shown] == ["p1"]  # only the cut case: p0 is not shown behind it
    line = shown[0][1]
    assert len(line) <= 200 and line.endswith("Confirmed answer: A (One).")
    question = line.removeprefix("- Past case 1: ").split(" … Options:")[0]
    assert question and big.question.startswith(question + " ")  # whole words from the start
    assert select(mem, frozenset(), cfg) == shown
    assert select(mem, frozenset(), cfg.model_copy(update={"context_tokens": 5})) == []  # not even the frame fits
    assert select(mem, frozenset(), cfg.model_copy(update={"context_tokens": 0})) == []


def test_a_run_shows_the_most_recent_cases_newest_first_within_the_budget():
    cases = _cases()
    policy = load_policy("long-context").model_copy(update={"context_tokens": 250})  # 1,000 characters
    with EventStore(":memory:") as store:
        _sim(store, cases, policy, "lc")
        seen = _retrieved(store, "lc")
        answers = {e.case_id: e.payload["answer"] for e in store.iter("lc", types=["answer.given"])}
    ids = [c.case_id for c in cases]
    by_id = {c.case_id: c for c in cases}
    depths = []
    for i, e in enumerate(seen):
        assert e.case_id == ids[i]
        shown = [ep["source_case_id"] for ep in e.payload["episodes"]]
        assert shown == ids[:i][::-1][:len(shown)]  # the most recent first, no gap
        lines = _section(e.payload["prefix"])
        assert len(lines) == len(shown) and len("\n".join(lines)) <= 1000
        assert all(line.startswith(f"- Past case {n}: ") for n, line in enumerate(lines, 1))
        if shown:  # the previous case's outcome: the agent's answer and the confirmed answer, by letter and text
            prev = by_id[shown[0]]
            assert f"Confirmed answer: {prev.answer} ({prev.options[prev.answer]})." in lines[0]
            assert f"The agent answered {answers[prev.case_id]} ({prev.options[answers[prev.case_id]]}): " in lines[0]
            assert "; ".join(f"{k}) {v}" for k, v in prev.options.items()) in lines[0]
        depths.append(len(shown))
    assert depths[0] == 0 and depths[1] == 1
    assert max(depths) > 1 and depths[-1] < len(cases) - 1  # more than one case, and the budget did bite


# --- the leakage guard ---------------------------------------------------------------------------


def test_a_case_never_sees_itself_nor_a_case_of_the_same_content():
    a, x = _cases(2)
    twin = a.model_copy(update={"case_id": "a-again", "options": dict(zip("ABCD", reversed(a.options.values()))),
                                "answer": "ABCD"[3 - "ABCD".index(a.answer)]})  # renamed, options shuffled
    with EventStore(":memory:") as store:
        _sim(store, [a, x, twin], load_policy("long-context"), "lc")
        seen = {e.case_id: [ep["source_case_id"] for ep in e.payload["episodes"]] for e in _retrieved(store, "lc")}
    assert seen == {a.case_id: [], x.case_id: [a.case_id], "a-again": [x.case_id]}  # `a` fits, but is its twin


def test_a_past_case_is_shown_only_after_its_feedback_and_a_case_in_flight_not_at_all():
    cases = _cases(8)
    ids = [c.case_id for c in cases]
    for lag in (0, 1):
        with EventStore(":memory:") as store:
            _sim(store, cases, load_policy("long-context"), f"lag{lag}", lag=lag)
            feedback = {e.case_id: e.seq for e in store.iter(f"lag{lag}", types=["feedback.recorded"])}
            seen = _retrieved(store, f"lag{lag}")
        for i, e in enumerate(seen):
            shown = [ep["source_case_id"] for ep in e.payload["episodes"]]
            assert all(feedback[c] <= e.payload["memory_seq"] < e.seq for c in shown), (lag, i)
            # the budget holds them all: every case whose feedback the pinned memory holds, newest first
            assert shown == ids[:max(0, i - lag)][::-1], (lag, i)
            assert e.payload["prefix"].count("Confirmed answer:") == len(shown)


def test_a_frozen_split_reads_the_training_cases_and_never_its_repeat_of_one(tmp_path):
    db = str(tmp_path / "f.duckdb")
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    cases = _cases(6)
    train.write_text("".join(c.model_dump_json() + "\n" for c in cases[:4]))
    repeat = cases[1].model_copy(update={"case_id": "t-repeat"})
    test.write_text("".join(c.model_dump_json() + "\n" for c in [*cases[4:], repeat]))
    res = CliRunner().invoke(main, ["run", str(train), "--db", db, "--policy", "long-context", "--backbone", "sim",
                                    "--run-id", "train", "--json"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["run", str(test), "--db", db, "--policy", "long-context", "--backbone", "sim",
                                    "--memory-from", "train", "--run-id", "frozen", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["memory"]["past_cases"] == 4  # read-only: the test cases were not kept
    with EventStore(db, read_only=True) as store:
        seen = {e.case_id: [ep["source_case_id"] for ep in e.payload["episodes"]] for e in _retrieved(store, "frozen")}
    newest_first = ["c03", "c02", "c01", "c00"]
    assert seen["c04"] == seen["c05"] == newest_first
    assert seen["t-repeat"] == ["c03", "c02", "c00"]


# --- patient data --------------------------------------------------------------------------------


def test_identifiers_of_one_patient_are_never_shown_to_another(tmp_path, monkeypatch):
    """The free-text stream (tests/fixtures/freetext_identifiers.jsonl): every other patient's case is
    shown this patient's question, de-identified as memory events are, so no identifier crosses; with the
    de-identification of before issue 32, the same prompts carry names and phones across patients."""
    monkeypatch.setitem(freetext_leaks.POLICIES, "long-context", 'name = "long-context"\n')
    out, found = freetext_leaks.run_policy("long-context", tmp_path / "on.duckdb")
    assert out["cases"] == 34 and found["hits"] == 0, found["examples"]
    with EventStore(str(tmp_path / "on.duckdb"), read_only=True) as store:
        shown = [e for e in _retrieved(store, out["run_id"]) if e.payload["episodes"]]
    assert len(shown) == 33  # every case after the first saw past cases: the count had something to find
    off, leaked = freetext_leaks.run_policy("long-context", tmp_path / "off.duckdb", off=True)
    assert leaked["hits"] > 0 and leaked["by_place"].get("other-case", 0) > 0, leaked


# --- determinism: rebuild, checkpoint, verify, replay --------------------------------------------


def test_a_rebuild_and_a_checkpoint_equal_the_live_memory(store):
    cases = _cases()
    live = run_in(store, cases, RunSpec(policy=load_policy("long-context"), seed=0)).projection
    rebuilt = rebuild(store, "r", EmbeddingCache(shared_minilm()))
    assert rebuilt.state == live.state and len(live.state.policy_memory.cases) == len(cases)
    assert decode(encode(live.state.policy_memory)) == live.state.policy_memory


def test_verify_re_executes_a_long_context_run_identically_and_replay_runs_it(tmp_path):
    db = str(tmp_path / "v.duckdb")
    res = CliRunner().invoke(main, ["run", str(EXAMPLES), "--db", db, "--policy", "long-context", "--backbone", "sim",
                                    "--run-id", "src", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    ver = json.loads(CliRunner().invoke(main, ["verify", "--db", db, "src", "--json"]).stdout)
    assert ver["identical"] and ver["fingerprint"] == out["fingerprint"], ver
    res = CliRunner().invoke(main, ["replay", "--db", db, "--from", "src", "--permutations", "2", "--workers", "1",
                                    "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert len(rep["runs"]) == 2 and len({r["fingerprint"] for r in rep["runs"]} | {out["fingerprint"]}) == 3
    with EventStore(db, read_only=True) as store:
        for r in rep["runs"]:  # each permutation's context is its own recent history, in its own order
            order = [e.case_id for e in store.iter(r["run_id"], types=["case.received"])]
            for e in _retrieved(store, r["run_id"]):
                shown = [ep["source_case_id"] for ep in e.payload["episodes"]]
                before = order[:order.index(e.case_id)][::-1]
                assert shown == [c for c in before if c in shown] and set(shown) <= set(before)
