"""TermIndex (handlers/text.py): incremental Okapi BM25 that re-ranks a case's nearest past cases.
Scores agree with rank_bm25's BM25Okapi (the reference implementation) on the same words, whatever
order texts arrive in, and a score does not depend on the process's string hash seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grandrounds.handlers.text import TermIndex

rank_bm25 = pytest.importorskip("rank_bm25", reason="rank-bm25 is in the test extra: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [json.loads(line)["question"] for line in (ROOT / "examples" / "recurring_train.jsonl").read_text().splitlines()]
QUERIES = [json.loads(line)["question"] for line in (ROOT / "examples" / "recurring_test.jsonl").read_text().splitlines()]


def test_scores_agree_with_rank_bm25_as_memory_grows():
    index = TermIndex()
    for n, text in enumerate(TEXTS, start=1):
        index.add(f"t{n}", text)
        if n not in (1, 2, 5, len(TEXTS)):
            continue
        ref = rank_bm25.BM25Okapi([TermIndex.words(t) for t in TEXTS[:n]])
        keys = [f"t{i}" for i in range(1, n + 1)]
        for q in QUERIES[:6]:
            mine = index.scores(q, keys)
            theirs = ref.get_scores(TermIndex.words(q)).tolist()
            assert mine == pytest.approx(theirs, rel=1e-9, abs=1e-12)


def test_adding_a_text_twice_changes_nothing_and_unknown_keys_score_zero():
    index = TermIndex()
    index.add("a", TEXTS[0])
    index.add("b", TEXTS[1])
    before = index.scores(QUERIES[0], ["a", "b", "missing"])
    index.add("a", TEXTS[5])
    assert index.scores(QUERIES[0], ["a", "b", "missing"]) == before
    assert before[2] == 0.0
    assert TermIndex().scores(QUERIES[0], ["a"]) == [0.0]


def test_the_same_case_reworded_ranks_first_more_often_than_by_words_alone():
    """The point of it: on the recurring stream, BM25 puts a training case of the held-out case's own
    diagnosis first for most held-out cases (the real-model benchmark's measured gain comes from here)."""
    train = [json.loads(line) for line in (ROOT / "examples" / "recurring_train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (ROOT / "examples" / "recurring_test.jsonl").read_text().splitlines()]
    index = TermIndex()
    for c in train:
        index.add(c["case_id"], c["question"])
    keys = [c["case_id"] for c in train]
    hits = 0
    for c in test:
        s = index.scores(c["question"], keys)
        best = train[max(range(len(keys)), key=lambda i: (s[i], -i))]
        hits += best["options"][best["answer"]] == c["options"][c["answer"]]
    assert hits >= 24, hits


def test_scores_are_the_same_floats_under_any_hash_seed():
    code = ("import json,sys; from grandrounds.handlers.text import TermIndex; t=TermIndex(); "
            "texts=json.loads(sys.argv[1]); [t.add(str(i), x) for i, x in enumerate(texts[1:])]; "
            "print(json.dumps(t.scores(texts[0], [str(i) for i in range(len(texts) - 1)])))")
    arg = json.dumps([QUERIES[0], *TEXTS[:10]])
    outs = {subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("0", "1", "12345")}
    assert len(outs) == 1


def test_the_idf_floor_is_the_plain_sum_over_the_sorted_vocabulary_as_texts_arrive():
    """`_idf` keeps the vocabulary's document frequencies as an array updated as texts arrive (new words
    merged in, old ones counted up) and sums the terms with numpy: the floor must stay the float the
    plain Python sum over the sorted vocabulary gives, bit for bit, at every corpus size."""
    import math

    index = TermIndex()
    for n, text in enumerate(TEXTS + QUERIES, start=1):
        index.add(f"t{n}", text)
        if n % 3 and n > 8:
            continue  # several texts between two floors too: the merge of many new words at once
        df = index.df
        ref = sum([math.log(n - df[w] + 0.5) - math.log(df[w] + 0.5) for w in sorted(df)])
        assert index._idf() == (n, TermIndex.EPSILON * ref / len(df))
        assert index._vocab == sorted(df) and index._dfs.tolist() == [df[w] for w in index._vocab]


def test_memory_keeps_its_term_index_in_step_as_episodes_arrive_between_queries():
    """`EvoMemory.term_index` adds only the episodes stored since it was last asked (taken from the
    end of memory): the index it keeps equals one built from every episode in order, however the
    arrivals fall between queries."""
    from grandrounds.handlers.policies.evo_medagent import events as evo
    from grandrounds.handlers.policies.evo_medagent.memory import new_part

    memory = new_part(dim=4, exact_limit=64)
    batches = [1, 3, 1, 2, len(TEXTS) - 7]
    seq = 0
    for size in batches:
        for _ in range(size):
            memory.fold(seq, evo.EpisodeStored(episode_id=f"ep-{seq}", case_id=f"c-{seq}", descriptor=TEXTS[seq],
                                              trace=[], answer="A", gold="A", correct=True, summary="s",
                                              guideline="g", trigger=[]))
            seq += 1
        kept = memory.term_index()
        fresh = TermIndex()
        for ep in memory.episodes.values():
            fresh.add(ep.episode_id, ep.descriptor)
        assert list(kept.tf) == list(fresh.tf) == [f"ep-{i}" for i in range(seq)]
        assert kept.scores(QUERIES[0], list(fresh.tf)) == fresh.scores(QUERIES[0], list(fresh.tf))
