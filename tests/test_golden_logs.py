"""Golden logs: exported event logs of short runs (tests/golden/, written by scripts/golden_logs.py) must
re-execute with this build to the identical fingerprint.

A change that alters the event bytes of a run fails here; if the change is deliberate, regenerate the logs
with `python scripts/golden_logs.py` and say so in the commit message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grandrounds.replay.export import load_jsonl
from grandrounds.replay.verify import verify_run
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore

GOLDEN = Path(__file__).resolve().parent / "golden"
LOGS = sorted(GOLDEN.glob("*.jsonl"))


def test_there_is_a_golden_log_per_policy():
    names = {p.stem for p in LOGS}
    assert {"evo-medagent", "evo-medagent-tools", "skemex", "selsm", "retrosum", "precedent", "none"} <= names


@pytest.mark.slow  # a few seconds per log on an idle machine (MiniLM embeds each case)
@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_a_golden_log_re_executes_to_the_identical_fingerprint(path):
    events = load_jsonl(path)
    with EventStore(":memory:") as store:
        store.import_events(events)  # checks every chain hash of the file
        run_id = events[0].run_id
        result = verify_run(store, run_id, EmbeddingCache(shared_minilm(), store.conn))
    assert result["complete"] and result["chain_intact"]
    assert result["first_divergence"] is None, result["first_divergence"]
    assert result["replayed_fingerprint"] == result["fingerprint"]


def test_a_tampered_golden_log_does_not_verify():
    """The check can fail: an answer changed in the stored log no longer re-executes to the same bytes."""
    events = load_jsonl(GOLDEN / "none.jsonl")
    answer = next(e for e in events if e.type == "answer.given")
    with EventStore(":memory:") as store:
        store.import_events(events)
        store.conn.execute("UPDATE events SET payload = json_merge_patch(payload, ?) WHERE run_id = ? AND seq = ?",
                           ['{"source": "forged"}', answer.run_id, answer.seq])
        result = verify_run(store, answer.run_id, EmbeddingCache(shared_minilm(), store.conn))
    assert not result["identical"] and result["first_divergence"]["seq"] == answer.seq
