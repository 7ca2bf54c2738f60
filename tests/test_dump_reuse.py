"""The writer stores the dump de-identification already made of a memory event (`NewEvent.dumped`)
instead of dumping the payload again: that dump must be exactly what dumping the written payload
gives, for every event that carries one, and none may be carried where de-identification replaced
something (the payload written is then a new model)."""

from __future__ import annotations

import pytest

from grandrounds.store.eventstore import EventStore


@pytest.mark.parametrize("policy", ["evo-medagent", "selsm", "skemex", "precedent"])
def test_a_reused_dump_is_the_dump_of_the_payload_written(tmp_path, monkeypatch, policy):
    from grandrounds.app import run_cases
    from grandrounds.handlers.cases import load_cases
    from grandrounds.handlers.policies.config import load_policy
    from grandrounds.handlers.runs import RunSpec
    from grandrounds.store.embeddings import EmbeddingCache
    from tests.llm_helpers import HashEmbedder

    reused = 0
    real = EventStore._build_rows

    def checking(self, run_id, events, head):
        nonlocal reused
        for ev in events:
            if ev.dumped is not None:
                reused += 1
                assert ev.payload.carries_memory
                assert ev.dumped == ev.payload.model_dump(mode="json"), ev.type  # at write time
        return real(self, run_id, events, head)

    monkeypatch.setattr(EventStore, "_build_rows", checking)
    cases, _ = load_cases("examples/cases.jsonl")
    with EventStore(tmp_path / "r.duckdb") as store:
        cache = EmbeddingCache(HashEmbedder(), store.conn, machine=None)
        run_cases(store, cases, RunSpec(policy=load_policy(policy)), run_id="r", cache=cache)
    assert reused > 0  # the path ran


def _episode(question: str):
    from grandrounds.handlers.policies.evo_medagent.events import EpisodeStored

    return EpisodeStored(episode_id="ep-1", case_id="c1", descriptor=question, trace=["reasoning: x"], answer="A",
                         gold="A", correct=True, summary=f"Answered A: {question}", guideline="Prefer A.",
                         trigger=["finding"])


def test_no_dump_is_offered_where_an_identifier_was_replaced():
    from grandrounds.handlers.deidentify import Deidentifier
    from grandrounds.store.event_types import CaseReceived

    d = Deidentifier(store=None, run_id="r")
    question = "Mr. Peter Stafford, MRN S6534835, seen 2023-04-05: which finding?"
    d.observe(CaseReceived(index=0, case={"case_id": "c1", "question": question,
                                          "options": {"A": "fever", "B": "cough"}}), "c1")
    identified = _episode(question)
    clean, dumped = d.scrub_dumped(identified, "c1")
    assert dumped is None and clean is not identified and "S6534835" not in clean.model_dump_json()
    assert d.scrub(identified, "c1") == clean
    plain = _episode("Which finding suggests pneumonia?")
    same, dumped = d.scrub_dumped(plain, "c1")
    assert same is plain and dumped == plain.model_dump(mode="json")
