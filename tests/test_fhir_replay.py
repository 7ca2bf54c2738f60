"""Order and counterfactual replays of MedAgentBench FHIR runs (`grandrounds replay --from RUN` of a run
made with `grandrounds run TASKS --env medagentbench`): the environment is rebuilt from the files the
run recorded (checked by hash), and the replays are deterministic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import MAB_FUNCS as FUNCS, MAB_PATIENTS as PATIENTS, MAB_TASKS as TASKS, needs_medagentbench, copy_db
from fhir_helpers import FhirFake, invoke_json, offline_tasks_file, run_fhir
from llm_helpers import SECRET
from grandrounds.store.eventstore import EventStore

pytestmark = needs_medagentbench



@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return offline_tasks_file(tmp_path_factory.mktemp("mab"))


def _replay(db: Path, source: str, *extra: str, env: dict | None = None) -> tuple[int, dict]:
    return invoke_json(["replay", "--db", str(db), "--from", source, *extra], env)


def _events(db: Path, run_id: str) -> list:
    with EventStore(str(db), read_only=True) as s:
        return s.read(run_id)


def _same_after_start(db: Path, source: str, replayed: str) -> None:
    """The replay's events are the source's, byte for byte, except `run.started.source` (the parent run)."""
    a, b = _events(db, source), _events(db, replayed)
    assert [(e.seq, e.type, e.payload) for e in a[1:]] == [(e.seq, e.type, e.payload) for e in b[1:]]
    assert {**b[0].payload, "source": a[0].payload["source"]} == a[0].payload and b[0].payload["source"] == source


@pytest.fixture(scope="module")
def sim_run(tasks, tmp_path_factory):
    db = tmp_path_factory.mktemp("run") / "fhir.duckdb"
    code, out = run_fhir(tasks, db)
    assert code == 0, out
    assert out["cases"] == 8 and out["accuracy"] == 1.0
    return db, out


def test_permutations_of_a_fhir_run_replay_deterministically(sim_run, tmp_path):
    db, out = sim_run
    first, second = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    copy_db(db, first)
    copy_db(db, second)
    code, rep = _replay(first, out["run_id"], "--permutations", "2", "--seed", "3")
    assert code == 0, rep
    assert rep["environment"] == "medagentbench" and rep["workers"] == 1 and rep["cases_executed"] == 16
    assert [r["k"] for r in rep["runs"]] == [0, 1]
    # The sim agent is scripted: every order grades every task as the source did.
    assert rep["source_accuracy"] == 1.0 and [r["accuracy"] for r in rep["runs"]] == [out["accuracy"]] * 2
    assert all(r["correct"] == 8 and r["cases"] == 8 for r in rep["runs"])
    # Another order is another history (memory written in another order): another fingerprint.
    assert len({out["fingerprint"], *(r["fingerprint"] for r in rep["runs"])}) == 3
    # The same permutations, replayed again against another sandbox in another file: the same bytes.
    code, again = _replay(second, out["run_id"], "--permutations", "2", "--seed", "3", "--workers", "4")
    assert code == 0, again
    assert [r["fingerprint"] for r in again["runs"]] == [r["fingerprint"] for r in rep["runs"]]
    assert not any(r["reused"] for r in again["runs"])
    # Asking again in the same file reuses the runs.
    code, reused = _replay(first, out["run_id"], "--permutations", "2", "--seed", "3")
    assert code == 0 and all(r["reused"] for r in reused["runs"]) and reused["cases_executed"] == 0
    # A replay run records its environment too: verify re-executes it identically.
    perm = rep["runs"][0]["run_id"]
    assert _events(first, perm)[0].meta["environment"] == _events(first, out["run_id"])[0].meta["environment"]
    assert "127.0.0.1" not in json.dumps([e.payload for e in _events(first, perm)])
    code, ver = invoke_json(["verify", "--db", str(first), perm])
    assert code == 0 and ver["identical"] and ver["replayed_fingerprint"] == rep["runs"][0]["fingerprint"], ver


def test_original_order_reproduces_the_source_run(sim_run, tmp_path):
    db, out = sim_run
    copy = tmp_path / "o.duckdb"
    copy_db(db, copy)
    code, rep = _replay(copy, out["run_id"], "--permutations", "0", "--original")
    assert code == 0, rep
    (orig,) = rep["runs"]
    assert orig["k"] is None and orig["run_id"] == f"{out['run_id']}-original" and orig["accuracy"] == 1.0
    # Same events as the source from seq 1 on; the fingerprint differs only by `run.started.source`,
    # which names the parent run (as for every replay run).
    _same_after_start(copy, out["run_id"], orig["run_id"])
    with EventStore(str(copy), read_only=True) as s:
        assert s.fingerprint(orig["run_id"]) == orig["fingerprint"]
        assert s.fingerprint(out["run_id"]) == out["fingerprint"]
    # A replay of the replay (its environment checked through its parent): the same events again.
    code, again = _replay(copy, orig["run_id"], "--permutations", "0", "--original")
    assert code == 0, again
    _same_after_start(copy, orig["run_id"], again["runs"][0]["run_id"])


def test_counterfactual_policy_replays_fhir_runs(sim_run, tmp_path, monkeypatch):
    db, out = sim_run
    copy = tmp_path / "c.duckdb"
    copy_db(db, copy)
    code, rep = _replay(copy, out["run_id"], "--permutations", "1", "--original", "--policy", "none")
    assert code == 0, rep
    assert rep["counterfactual"] and rep["policy"] == "none" and rep["tag"].startswith("none-")
    assert [r["accuracy"] for r in rep["runs"]] == [1.0, 1.0]  # the sim agent needs no memory
    types = [e.type for e in _events(copy, rep["runs"][0]["run_id"])]
    assert "rule.added" not in types and "episode.stored" not in types and types.count("case.completed") == 8
    code, abl = _replay(copy, out["run_id"], "--permutations", "1", "--ablation", "no-writing")
    assert code == 0 and abl["counterfactual"] and abl["tag"].startswith("no-writing-"), abl
    types = [e.type for e in _events(copy, abl["runs"][0]["run_id"])]
    assert "rule.added" not in types and abl["runs"][0]["accuracy"] == 1.0
    # A policy whose stages do not handle FHIR tasks is refused up front (exit 2), as `grandrounds run` does.
    import grandrounds.handlers.environments.medagentbench.run as fhir_run

    monkeypatch.setattr(fhir_run, "SUPPORTED_POLICIES", ("evo-medagent", "none"))
    code, bad = _replay(copy, out["run_id"], "--permutations", "1", "--policy", "skemex")
    assert code == 2 and "FHIR tasks" in bad["error"] and "skemex" in bad["error"], bad


@pytest.mark.parametrize("which", ["funcs", "patients"])
def test_replay_refuses_when_a_recorded_file_changed(tasks, tmp_path, which):
    funcs, patients = tmp_path / "funcs_v1.json", tmp_path / "patients.json"
    shutil.copy(FUNCS, funcs)
    shutil.copy(PATIENTS, patients)
    db = tmp_path / "r.duckdb"
    code, out = run_fhir(tasks, db, "--task-type", "1", funcs=funcs, patients=patients)
    assert code == 0, out
    code, ok = _replay(db, out["run_id"], "--permutations", "1")
    assert code == 0, ok
    changed = funcs if which == "funcs" else patients
    changed.write_text(changed.read_text().replace("Patient", "Patient "))
    code, rep = _replay(db, out["run_id"], "--permutations", "2", "--seed", "9")
    assert code == 2, rep
    assert "has changed since the run" in rep["error"] and str(changed) in rep["error"]
    assert "replay re-executes the run" in rep["error"]
    with EventStore(str(db), read_only=True) as s:  # refused before anything ran
        assert not any(r.run_id.endswith("-s9") for r in s.runs())
    changed.unlink()
    code, rep = _replay(db, out["run_id"], "--permutations", "1")
    assert code == 2 and "is missing" in rep["error"]


# --- a model run: replayed through the record backend ------------------------------------------------


def test_model_fhir_run_replays_from_its_record(tmp_path):
    db = tmp_path / "model.duckdb"
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    with FhirFake() as server:
        code, out = run_fhir(TASKS, db, "--protocol", "react", "--backbone", "openai", "--model", "fake-fhir", "--base-url", server.base_url,
                         "--task-type", "1", "--limit", "2", "--run-id", "m1", env=env)
        assert code == 0 and out["correct"] == 2, out
        calls = len(server.requests)
    # The source order, served from the record: no model call, the source's events again.
    code, rep = _replay(db, "m1", "--permutations", "0", "--original", env=env)
    assert code == 0, rep
    assert rep["served_from"] == "m1" and rep["llm_calls"] == {"recorded": 6, "live": 0}
    assert rep["runs"][0]["accuracy"] == 1.0 and rep["backbone"] == "openai"
    _same_after_start(db, "m1", rep["runs"][0]["run_id"])
    assert len(server.requests) == calls
    # The other order (seed 2 swaps the two tasks): the task now first sees no memory, unlike in the
    # record: a divergence (exit 1), nothing written; with live fall-through the model answers the misses.
    code, div = _replay(db, "m1", "--permutations", "1", "--seed", "2", env=env)
    assert code == 1 and "diverged from the record" in div["error"] and "m1-perm0-s2" in div["error"], div
    with EventStore(str(db), read_only=True) as s:
        assert not s.has_run("m1-perm0-s2")
    with FhirFake() as server:
        code, live = _replay(db, "m1", "--permutations", "1", "--seed", "2", "--live-fallthrough",
                             "--base-url", server.base_url, env=env)
    assert code == 0, live
    (run,) = live["runs"]
    assert run["accuracy"] == 1.0 and run["llm_calls"]["live"] > 0 and run["llm_calls"]["live"] == len(server.requests)
