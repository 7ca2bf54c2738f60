"""Every run records the versions of the code that shaped its events; `verify` says which when they differ."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.handlers.code_versions import code_versions
from grandrounds.handlers.field_deidentifier import settings as field_settings
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.policies.evo_medagent import policy as retrieve  # the module that rounds retrieval scores
from grandrounds.handlers.stages import STAGE_VERSIONS
from grandrounds.replay.export import load_jsonl
from grandrounds.replay.verify import verify_run
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore
from replay_fixtures import db_copy, recorded_db  # noqa: F401

LEGACY = Path(__file__).resolve().parent / "golden" / "legacy" / "none-unversioned.jsonl"


def _verify(db, run_id: str) -> dict:
    res = CliRunner().invoke(main, ["verify", "--db", str(db), run_id, "--json"])
    return json.loads(res.stdout)


def test_a_run_records_its_policy_and_stage_code_versions(recorded_db):
    with EventStore(recorded_db, read_only=True) as store:
        started = store.read("src", upto_seq=0)[0].payload
    assert started["code"] == code_versions(EvoMedAgentPolicy()) == {
        "policy": 1, "stages": {"retrieve": 2, "act": 2, "feedback": 2, "reflect": 2, "govern": 2},
        "deidentifier": field_settings()}
    # a policy on an earlier de-identifier pattern set records no field tool (runs recorded before issue 41)
    assert "deidentifier" not in code_versions(EvoMedAgentPolicy(deidentify_patterns=2))
    # pattern set 3 ran the tool's rules version 1, and its runs re-execute with it
    assert code_versions(EvoMedAgentPolicy(deidentify_patterns=3))["deidentifier"] == field_settings(1)
    assert field_settings()["rules_version"] == 2


def test_verify_names_the_de_identifier_settings_when_they_changed_the_bytes(db_copy, monkeypatch):
    """A run recorded with other field-tool settings (here: a later rules version that also masks 'fever')
    re-executes to other bytes, and verify says which settings differ."""
    from grandrounds.handlers import field_deidentifier

    recorded = field_settings()
    changed = {**recorded, "rules_version": recorded["rules_version"] + 1, "config_digest": "0" * 64}
    monkeypatch.setattr(field_deidentifier, "settings", lambda rules=2: changed)
    real = field_deidentifier._rule_spans
    monkeypatch.setattr(field_deidentifier, "_rule_spans", lambda text, rules=2: real(text, rules) + [
        field_deidentifier.Found(m.start(), m.end(), "name", True, m.group()) for m in re.finditer("fever", text)])
    field_deidentifier._MEMO.clear()
    try:
        out = _verify(db_copy, "src")
    finally:
        field_deidentifier._MEMO.clear()
    assert not out["identical"], out
    assert any(f"de-identifier: recorded with philter-lite 0.6.0, rules {recorded['rules_version']}" in d for d in out["code_versions"]["differences"]), out


def test_verify_names_the_versions_when_a_bumped_stage_changed_the_bytes(db_copy, monkeypatch):
    # The retrieve stage now rounds scores to 5 decimals instead of 6, and says so with its version.
    monkeypatch.setattr(retrieve, "_r6", lambda x: round(float(x), 5))
    monkeypatch.setitem(STAGE_VERSIONS, "retrieve", 3)
    out = _verify(db_copy, "src")
    assert not out["identical"] and not out["ok"]
    assert "retrieve: recorded by version 2, this build is 3" in " ".join(out["reasons"])
    assert out["code_versions"]["recorded"]["stages"]["retrieve"] == 2
    assert out["code_versions"]["build"]["stages"]["retrieve"] == 3


def test_a_bumped_version_that_changed_nothing_still_verifies_with_a_warning(db_copy, monkeypatch):
    monkeypatch.setattr(EvoMedAgentPolicy, "code_version", 7)
    out = _verify(db_copy, "src")
    assert out["identical"] and out["ok"]
    assert any("policy: recorded by version 1, this build is 7" in w for w in out["warnings"])


def test_a_log_recorded_before_versions_re_executes_identically():
    """Old logs hold no versions; their re-execution writes none either, so their bytes stay the same."""
    events = load_jsonl(LEGACY)
    assert "code" not in events[0].payload
    with EventStore(":memory:") as store:
        store.import_events(events)
        result = verify_run(store, events[0].run_id, EmbeddingCache(shared_minilm(), store.conn))
    assert result.identical and result.ok
    assert result.code_versions["recorded"] is None and result.code_versions["differences"]


LEGACY_FLOAT = Path(__file__).resolve().parent / "golden" / "legacy" / "evo-medagent-stages-v1.jsonl"


def test_a_log_of_the_float_arithmetic_keeps_its_chain_and_is_named_not_re_executed():
    """Stage version 1 logs (before recorded embeddings and int8 arithmetic, grandrounds <= a96edf8): their
    chain and fingerprint still check on any machine, and verify says that they were recorded by version 1
    of every stage instead of reporting a bare divergence; they re-execute only with the build that wrote
    them (README, "Old logs")."""
    events = load_jsonl(LEGACY_FLOAT)  # the import re-checks every chain hash
    assert events[0].payload["code"]["stages"]["retrieve"] == 1
    assert not any(e.type == "embeddings.recorded" for e in events)
    with EventStore(":memory:") as store:
        store.import_events(events)
        assert store.check_chain(events[0].run_id).break_seq is None
        result = verify_run(store, events[0].run_id, EmbeddingCache(shared_minilm(), store.conn))
    assert result.chain_intact and not result.identical
    assert "retrieve: recorded by version 1, this build is 2" in " ".join(result.reasons)


LEGACY_BEFORE_44 = Path(__file__).resolve().parent / "golden" / "legacy"


@pytest.mark.parametrize("log, field", [
    # SELSM policy version 1 embedded states whole; without `state_view` it re-executes with the whole text.
    ("selsm-state-view-1.jsonl", "state_view"),
    # RetroSum policy version 1 left summaries to the agent loop's --summary-every; without `summary_every`
    # it re-executes that way.
    ("retrosum-retrospection-1.jsonl", "summary_every"),
])
def test_a_log_from_before_issue_44_re_executes_identically(log, field):
    """A policy version 1 log (before issue 44) lacks the field the change added, so it is rebuilt with
    the field's recorded default (recorded_defaults) and re-executes to the same bytes."""
    events = load_jsonl(LEGACY_BEFORE_44 / log)
    started = events[0].payload
    assert started["code"]["policy"] == 1 and field not in started["policy"]
    with EventStore(":memory:") as store:
        store.import_events(events)
        result = verify_run(store, events[0].run_id, EmbeddingCache(shared_minilm(), store.conn))
    assert result.identical and result.ok
    assert "policy: recorded by version 1, this build is 2" in result.code_versions["differences"]
