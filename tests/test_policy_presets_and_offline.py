"""Across policies: preset files, `grandrounds policies`, ablation switches on `run`, and
offline mode (memory built on a train split, a test split answered from a frozen snapshot)."""

from __future__ import annotations

import json
import tomllib

import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.handlers.policies.config import PRESET_DIR, PolicyError, load_policy, preset_names, with_ablations
from grandrounds.handlers.policies.registry import config_class, known_policies
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.eventstore import EventStore
from tests.conftest import EXAMPLES


def _run(*args: str) -> tuple[int, dict]:
    res = CliRunner().invoke(main, [*args, "--json"])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("{")]
    return res.exit_code, (json.loads(lines[-1]) if lines else {"output": res.output})


# --- presets ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", preset_names())
def test_each_preset_file_spells_out_exactly_the_class_defaults(name):
    data = tomllib.loads((PRESET_DIR / f"{name}.toml").read_text(encoding="utf-8"))
    cls = config_class(data["name"])
    defaults = cls().model_dump(mode="json")
    assert load_policy(name) == cls()  # the file changes nothing ...
    assert set(data) == set(defaults)  # ... and leaves nothing out: every parameter is visible


def test_every_registered_policy_ships_a_preset():
    assert set(preset_names()) == set(known_policies())


def test_policies_command_lists_parameters_and_ablations():
    code, out = _run("policies")
    assert code == 0
    by_name = {p["name"]: p for p in out["policies"]}
    assert set(by_name) == set(preset_names())
    evo = by_name["evo-medagent"]
    assert evo["parameters"]["w_utility"]["value"] == 0.4
    assert "escalates" in evo["parameters"]["duplicate_cosine"]["doc"]
    assert evo["ablations"]["episodic-only"] == {"procedural": False}
    code, out = _run("policies", "nope")
    assert code == 2 and "no preset 'nope'" in out["error"]


def test_policy_files_are_validated_with_the_field_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "evo-medagent"\ntop_k_rules = -1\n')
    with pytest.raises(PolicyError, match="top_k_rules"):
        load_policy(str(bad))
    bad.write_text('name = "evo-medagent"\ntop_k_rule = 3\n')
    with pytest.raises(PolicyError, match="top_k_rule"):
        load_policy(str(bad))
    bad.write_text('name = "evo-medagnet"\n')
    with pytest.raises(PolicyError, match="unknown policy 'evo-medagnet'"):
        load_policy(str(bad))
    bad.write_text('name = [\n')
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policy(str(bad))
    code, out = _run("run", str(EXAMPLES), "--db", str(tmp_path / "x.duckdb"), "--policy", str(bad))
    assert code == 2 and "not valid TOML" in out["error"]


def test_ablation_switches_apply_on_run_and_unknown_ones_are_bad_input(tmp_path):
    assert with_ablations(load_policy("evo-medagent"), ["episodic-only"]).procedural is False
    with pytest.raises(PolicyError, match="unknown ablation 'w/o-all'.*known: no-writing"):
        with_ablations(load_policy("evo-medagent"), ["w/o-all"])
    db = str(tmp_path / "a.duckdb")
    code, out = _run("run", str(EXAMPLES), "--db", db, "--ablation", "w/o-all")
    assert code == 2 and "unknown ablation" in out["error"]
    code, out = _run("run", str(EXAMPLES), "--db", db, "--ablation", "episodic-only")
    assert code == 0 and out["memory"]["rules"] == 0 and out["memory"]["episodes"] == 78


# --- offline mode ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """Train on the first half of the example stream, test on the second half."""
    root = tmp_path_factory.mktemp("offline")
    lines = EXAMPLES.read_text(encoding="utf-8").splitlines()
    train, test = root / "train.jsonl", root / "test.jsonl"
    train.write_text("\n".join(lines[:39]) + "\n")
    test.write_text("\n".join(lines[39:]) + "\n")
    db = str(root / "offline.duckdb")
    code, out = _run("run", str(train), "--db", db, "--run-id", "train")
    assert code == 0
    return root, db, train, test, out


def _types(db: str, run_id: str) -> list[str]:
    with EventStore(db, read_only=True) as store:
        return [e.type for e in store.iter(run_id)]


def test_frozen_test_run_reads_the_train_memory_and_writes_none(split):
    root, db, train, test, trained = split
    code, frozen = _run("run", str(test), "--db", db, "--run-id", "test", "--memory-from", "train")
    assert code == 0, frozen
    assert any("memory from run train (frozen)" in n for n in frozen["notes"])
    types = _types(db, "test")
    assert types[:2] == ["run.started", "memory.seeded"]
    memory_writes = {"rule.added", "rule.edited", "rule.priority_changed", "rule.retired", "episode.stored",
                     "reflection.recorded", "tool.label_changed"}
    assert not memory_writes & set(types)
    # The snapshot's memory is the train run's, and it is what answers the test split.
    assert frozen["memory"]["rules"] == trained["memory"]["rules"]
    code, none = _run("run", str(test), "--db", db, "--run-id", "test-none", "--policy", "none")
    assert frozen["accuracy"] > none["accuracy"] + 0.3  # sim backbone: a mechanism check, not clinical accuracy
    with EventStore(db, read_only=True) as store:
        started = next(store.iter("test")).decode()
        head_seq, head_chain = store.head("train")
    assert started.memory_from == {"run_id": "train", "seq": head_seq, "chain": head_chain}
    assert started.policy["writing"] is False
    # Self-contained and deterministic: verify re-executes it from its own log.
    res = CliRunner().invoke(main, ["verify", "--db", db, "test", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["identical"]


def test_keep_learning_and_a_train_run_in_another_file(split, tmp_path):
    root, db, train, test, _ = split
    other = str(tmp_path / "test.duckdb")
    code, out = _run("run", str(test), "--db", other, "--run-id", "t2", "--memory-from", "train",
                     "--memory-db", db, "--keep-learning")
    assert code == 0, out
    types = _types(other, "t2")
    assert types[1] == "memory.seeded" and "rule.added" in types


def test_a_case_never_retrieves_memory_derived_from_itself_across_runs(split, tmp_path):
    root, db, train, test, _ = split
    both = tmp_path / "again.jsonl"
    both.write_text(train.read_text(encoding="utf-8"))  # the train cases themselves, as a test split
    code, out = _run("run", str(both), "--db", db, "--run-id", "again", "--memory-from", "train")
    assert code == 0
    with EventStore(db, read_only=True) as store:
        seeded = [e for e in store.iter("train") if e.type in ("rule.added", "episode.stored")]
        origin = {e.payload.get("rule_id") or e.payload["episode_id"]: e.case_id for e in seeded}
        shown = 0
        for e in store.iter("again", types=["memory.retrieved"]):
            ids = [r["rule_id"] for r in e.payload["rules"]] + [x["episode_id"] for x in e.payload["episodes"]]
            shown += len(ids)
            assert all(origin[i] != e.case_id for i in ids), e.case_id
    assert shown > 0


def test_offline_mode_refuses_another_policys_memory_and_unknown_runs(split):
    root, db, train, test, _ = split
    code, out = _run("run", str(test), "--db", db, "--policy", "none", "--memory-from", "train")
    assert code == 2 and "holds evo-medagent memory" in out["error"]
    code, out = _run("run", str(test), "--db", db, "--memory-from", "nope")
    assert code == 2 and "no run 'nope'" in out["error"]
    code, out = _run("run", str(test), "--db", db, "--memory-db", db)
    assert code == 2 and "--memory-db needs --memory-from" in out["error"]


def test_agent_settings_are_part_of_the_run_spec_only_when_changed():
    spec = RunSpec(policy=load_policy("evo-medagent"))
    assert "agent" not in spec.started_event("e").model_dump(mode="json")
    changed = spec.model_copy(update={"agent": {"max_steps": 3}})
    assert changed.started_event("e").agent == {"max_steps": 3}
    assert changed.default_run_id() != spec.default_run_id()
