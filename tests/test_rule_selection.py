"""`select_rules`: the guards (leakage, trigger floor) are applied best first and stop once
top_k_rules have passed, and the result is the one the plain recipe gives: score every
candidate with `rule_utility` and `selection_score`, drop the guarded ones, sort, take top k."""

from __future__ import annotations

import numpy as np

from grandrounds.handlers.policies import precedents
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.policies.evo_medagent import policy as evo_policy
from grandrounds.handlers.policies.evo_medagent.events import RuleAdded
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.event_types import FeedbackRecorded, RuleOutcome, RunStarted
from grandrounds.store.eventstore import EventStore
from grandrounds.store.projection import MemoryProjection


class _Table:
    name, dim = "table-8", 8

    def __init__(self, table):
        self.table = table

    def embed_one(self, text):
        return self.table[text]


def _memory(cfg: EvoMedAgentPolicy, n: int = 24):
    rng = np.random.default_rng(7)
    texts = [f"rule text {i}" for i in range(n)]
    table = {}
    for t in texts + ["query"]:
        v = rng.standard_normal(8).astype(np.float32)
        table[t] = v / np.linalg.norm(v)
    store = EventStore(":memory:")
    proj = MemoryProjection(8).bind(EmbeddingCache(_Table(table), store.conn))
    proj.apply(0, RunStarted(policy_name="evo-medagent", policy=cfg.model_dump(mode="json"), backbone="sim",
                             seed=0, embedder="table-8"))
    for i, text in enumerate(texts):  # every third rule was learnt from the case being answered
        proj.apply(i + 1, RuleAdded(rule_id=f"r{i}", text=text, trigger=["fever"], priority=i % 3,
                                    source_case_id="own" if i % 3 == 0 else f"c{i}"))
    seq = n + 1
    for i in range(0, n, 2):  # mixed utilities: some rules tested, helpful or not
        proj.apply(seq, FeedbackRecorded(answer="A", gold="A", correct=bool(i % 4),
                                         rule_outcomes=[RuleOutcome(rule_id=f"r{i}", helpful=bool(i % 4))]))
        seq += 1
    return proj, table["query"], store


def _reference(proj, cfg, own, query, tokens):
    mem = evo_policy.evo_memory(proj)
    out = []
    for label, rel in mem.rule_index.search(query, cfg.candidate_pool):
        rule = mem.rules[mem.rule_by_label[label]]
        if own in rule.derived_from or not precedents.rule_matches(rule.trigger, rule.text, tokens, cfg.rule_floor):
            continue
        u = evo_policy.rule_utility(rule, mem.feedback_count, cfg)
        out.append((-evo_policy.selection_score(rel, u, rule.priority, cfg), rule.created_seq, rule, rel, u))
    out.sort(key=lambda t: (t[0], t[1]))
    return [(r, rel, u, -neg) for neg, _, r, rel, u in out[: cfg.top_k_rules]]


def test_selection_equals_the_plain_recipe_and_checks_triggers_only_until_top_k_pass(monkeypatch):
    cfg = EvoMedAgentPolicy()
    proj, query, store = _memory(cfg)
    tokens = {"fever"}
    expected = _reference(proj, cfg, "own", query, tokens)
    calls = []

    def counting(*args):
        calls.append(args[1])
        return precedents.rule_matches(*args)

    monkeypatch.setattr(evo_policy, "rule_matches", counting)
    got = evo_policy.select_rules(proj, cfg, "own", query, tokens)
    store.close()
    assert len(got) == cfg.top_k_rules == 5
    assert [(r.rule_id, rel, u, s) for r, rel, u, s in got] == [(r.rule_id, rel, u, s) for r, rel, u, s in expected]
    # 24 candidates, 8 of them the case's own: the trigger is read for the 5 shown rules only.
    assert calls == [r.text for r, *_ in got]


def test_no_rules_asked_none_returned():
    cfg = EvoMedAgentPolicy(top_k_rules=0)
    proj, query, store = _memory(cfg)
    assert evo_policy.select_rules(proj, cfg, "own", query, {"fever"}) == []
    store.close()
