"""Golden logs: exported event logs of short runs (tests/golden/, written by scripts/golden_logs.py) must
re-execute with this build to the identical fingerprint.

They cover each policy (MCQ cases, sim backbone, one with simulated tools), a recorded-model run
(`model-evo-medagent`: --backbone openai against the fake server; verify serves it its own recorded
exchanges, so no server is needed) and each environment (`env-medagentbench`: FHIR tasks against the
local sandbox; `env-agentclinic`: OSCE cases; sim backbone). An environment run is re-executed against
the files its `run.started` names (path and sha256: the shared benchmark data, never copied into the
repository); where they are absent its tests skip, naming the missing file.

A change that alters the event bytes of a run fails here; if the change is deliberate, regenerate the logs
with `python scripts/golden_logs.py` and say so in the commit message. tests/golden/patterns-v2/ holds the
same runs as recorded before issue 41 (de-identifier pattern set 2), tests/golden/patterns-v3/ as recorded
with pattern set 3 (the field tool's rules version 1): they must verify too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grandrounds.replay.export import load_jsonl
from grandrounds.replay.verify import verify_run
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore

GOLDEN = Path(__file__).resolve().parent / "golden"
PREVIOUS = {GOLDEN / "patterns-v2": 2, GOLDEN / "patterns-v3": 3}
"""The same runs as recorded before (de-identifier pattern set 2, the k-subjects rule on every word; pattern set
3, the field tool's rules version 1), by the pattern set they recorded: they re-execute with their own recorded
settings, so a log written before a deliberate change still verifies."""
CURRENT_PATTERNS = 4
LOGS = sorted(GOLDEN.glob("*.jsonl")) + [p for folder in PREVIOUS for p in sorted(folder.glob("*.jsonl"))]
LOG_IDS = [str(p.relative_to(GOLDEN).with_suffix("")) for p in LOGS]
POLICIES = {"evo-medagent", "evo-medagent-tools", "skemex", "selsm", "retrosum", "precedent", "long-context", "none"}
MODEL_RUNS = {"model-evo-medagent"}
ENVIRONMENTS = {"env-medagentbench": "medagentbench", "env-agentclinic": "agentclinic"}


def _file_refs(value) -> list[str]:
    """The paths of the files an environment record names ({"path", "sha256"} entries, at any depth)."""
    if isinstance(value, dict):
        if "path" in value and "sha256" in value:
            return [value["path"]]
        return [p for v in value.values() for p in _file_refs(v)]
    return []


def _load(path: Path):
    """The log's events; skips when it names environment files that are not on this machine."""
    events = load_jsonl(path)
    missing = [p for p in _file_refs(events[0].meta.get("environment") or {}) if not Path(p).exists()]
    if missing:
        pytest.skip(f"{path.name} re-executes against the shared benchmark data: {', '.join(missing)} not found")
    return events


def test_there_is_a_golden_log_per_policy_model_run_and_environment():
    for folder in (GOLDEN, *PREVIOUS):
        names = {p.stem for p in folder.glob("*.jsonl")}
        assert POLICIES | MODEL_RUNS | set(ENVIRONMENTS) <= names, folder


def test_the_golden_logs_are_of_the_de_identifier_they_stand_for():
    """This build's logs record pattern set 4 and the field tool's settings of rules 2; the previous ones
    pattern set 2 (no field tool) and 3 (its rules 1)."""
    for folder, patterns in ((GOLDEN, CURRENT_PATTERNS), *PREVIOUS.items()):
        for path in folder.glob("*.jsonl"):
            started = load_jsonl(path)[0].payload
            assert started["policy"].get("deidentify_patterns", 1) == patterns, path
            tool = (started.get("code") or {}).get("deidentifier")
            assert (tool or {}).get("rules_version") == {2: None, 3: 1, 4: 2}[patterns], path


def test_the_golden_logs_are_the_runs_they_are_named_for():
    """Each new kind of golden log holds the run it stands for (a model run records its exchanges; an
    environment run names its environment), in clear (a sealed log would need a key file we do not have)."""
    for name in MODEL_RUNS | set(ENVIRONMENTS):
        events = load_jsonl(GOLDEN / f"{name}.jsonl")
        started = events[0]
        assert not any("$sealed" in e.payload for e in events), name
        if name in MODEL_RUNS:
            assert started.payload["backbone"] == "openai" and started.payload["model"]
            assert any(e.type == "llm.exchange" for e in events), name
        else:
            assert started.payload["backbone"] == "sim"
            assert started.meta["environment"]["name"] == ENVIRONMENTS[name]
        assert sum(e.type == "case.completed" for e in events) >= 2


@pytest.mark.slow  # a few seconds per log on an idle machine (MiniLM embeds each case)
@pytest.mark.parametrize("path", LOGS, ids=LOG_IDS)
def test_a_golden_log_re_executes_to_the_identical_fingerprint(path):
    events = _load(path)
    with EventStore(":memory:") as store:
        store.import_events(events)  # checks every chain hash of the file
        run_id = events[0].run_id
        result = verify_run(store, run_id, EmbeddingCache(shared_minilm(), store.conn))
    assert result.complete and result.chain_intact
    assert result.first_divergence is None, result.first_divergence
    assert result.replayed_fingerprint == result.fingerprint
    assert result.replayed_from_record == (path.stem in MODEL_RUNS)  # a model run: no server, its record


@pytest.mark.parametrize("name", ["none", pytest.param("model-evo-medagent", marks=pytest.mark.slow),
                                  pytest.param("env-medagentbench", marks=pytest.mark.slow),
                                  pytest.param("env-agentclinic", marks=pytest.mark.slow)])
def test_a_tampered_golden_log_does_not_verify(name):
    """The check can fail: an answer changed in the stored log no longer re-executes to the same bytes
    (for the model run too: the recorded exchanges give back the answer the model gave)."""
    events = _load(GOLDEN / f"{name}.jsonl")
    answer = next(e for e in events if e.type == "answer.given")
    with EventStore(":memory:") as store:
        store.import_events(events)
        store.conn.execute("UPDATE events SET payload = json_merge_patch(payload, ?) WHERE run_id = ? AND seq = ?",
                           ['{"source": "forged"}', answer.run_id, answer.seq])
        result = verify_run(store, answer.run_id, EmbeddingCache(shared_minilm(), store.conn))
    assert not result.identical and result.first_divergence.seq == answer.seq
