"""`grandrounds replay` of runs made with a model: permutations are served the source's
recorded exchanges by request hash. Without memory every request is independent of the
order, so a replay needs no live call; with memory a permutation asks for exchanges the
record does not hold, which fails naming the run, case and stage unless live fall-through
is allowed — then the live calls are counted and the fingerprints stay deterministic."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES, copy_db
from fake_openai_server import FakeOpenAI
from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy, NoMemoryPolicy
from grandrounds.handlers.runs import RunSpec
from llm_helpers import MODEL, HashEmbedder, live_options, run
from grandrounds.store.eventstore import EventStore

NO_ENDPOINT = {"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None}


@pytest.fixture(scope="module")
def cases():
    return load_cases(EXAMPLES)[0][:6]


@pytest.fixture(scope="module")
def source_db(tmp_path_factory, cases):
    """`none` and `evo` recorded live against the fake server (then stopped), `sim` offline."""
    db = tmp_path_factory.mktemp("replay-rec") / "src.duckdb"
    with FakeOpenAI() as server, EventStore(db) as store:
        for run_id, policy in (("none", NoMemoryPolicy()), ("evo", EvoMedAgentPolicy())):
            spec = RunSpec(policy=policy, backbone="openai", model=MODEL, seed=0)
            assert run(store, cases, spec, run_id, live_options(server)).summary["failed"] == 0
        run(store, cases, RunSpec(policy=NoMemoryPolicy(), seed=0), "sim", {})
    return db


@pytest.fixture
def db_copy(source_db, tmp_path, monkeypatch):
    """A writable copy, and the CLI's embedder swapped for the sources' fast hashing one."""
    monkeypatch.setattr("grandrounds.app.shared_minilm", HashEmbedder)
    path = tmp_path / "replay.duckdb"
    copy_db(source_db, path)
    return path


def _replay(db, source, *args, as_json=True, env=NO_ENDPOINT):
    argv = ["replay", "--db", str(db), "--from", source, "--permutations", "2", "--seed", "1", *args]
    res = CliRunner().invoke(main, argv + (["--json"] if as_json else []), env=env)
    return res, (json.loads(res.stdout.strip().splitlines()[-1]) if as_json and res.stdout.strip() else None)


def _served(store, run_id):
    return [e.meta["served"] for e in store.iter(run_id, types=["llm.exchange"])]


def test_without_memory_every_recorded_exchange_is_reused(db_copy):
    res, out = _replay(db_copy, "none")
    assert res.exit_code == 0, res.output
    with EventStore(db_copy, read_only=True) as store:
        recorded = len(_served(store, "none"))
        assert recorded > 0
        for r in out["runs"]:
            assert r["llm_calls"] == {"recorded": recorded, "live": 0}
            assert set(_served(store, r["run_id"])) == {"record"}
            started = store.read(r["run_id"], upto_seq=0)[0].payload
            assert started["backbone"] == "openai" and started["model"] == MODEL and started["source"] == "none"
    assert out["backbone"] == "openai" and out["workers"] == 1 and not out["counterfactual"]
    assert out["llm_calls"] == {"recorded": 2 * recorded, "live": 0} and out["served_from"] == "none"
    assert out["live_fallthrough"] is False and any("workers=1" in n for n in out["notes"])
    assert len({r["fingerprint"] for r in out["runs"]}) == 2

    res, _ = _replay(db_copy, "none", "--workers", "4", as_json=False)  # reused; human output
    assert res.exit_code == 0, res.output
    assert f"model calls {recorded} recorded / 0 live" in res.stdout
    assert f"{2 * recorded} served from the record of none, 0 live" in res.stdout
    assert "--workers 4 ignored" in res.stdout


def test_with_memory_a_miss_fails_naming_run_case_and_stage(db_copy, cases):
    res, out = _replay(db_copy, "evo")
    assert res.exit_code == 1, res.output
    msg = out["error"]
    m = re.search(r"replay run '(evo-perm\d-s1)' diverged from the record of run 'evo': case (\S+), stage (\w+)", msg)
    assert m, msg
    assert m.group(2) in {c.case_id for c in cases} and "--live-fallthrough" in msg
    with EventStore(db_copy, read_only=True) as store:
        assert not store.has_run(m.group(1))  # nothing of the diverged run was written


def test_live_fallthrough_counts_live_calls_and_stays_deterministic(source_db, db_copy, tmp_path):
    second = tmp_path / "again.duckdb"
    copy_db(source_db, second)
    outs = []
    with FakeOpenAI() as server:
        for db in (db_copy, second):
            res, out = _replay(db, "evo", "--live-fallthrough", "--base-url", server.base_url)
            assert res.exit_code == 0, res.output
            outs.append(out)
        assert server.requests
    first, again = outs
    assert first["llm_calls"]["live"] > 0 and first["live_fallthrough"] is True
    assert first["llm_calls"]["live"] == sum(r["llm_calls"]["live"] for r in first["runs"])
    assert [r["fingerprint"] for r in again["runs"]] == [r["fingerprint"] for r in first["runs"]]
    assert [r["llm_calls"] for r in again["runs"]] == [r["llm_calls"] for r in first["runs"]]
    with EventStore(db_copy, read_only=True) as store:
        for r in first["runs"]:
            served = _served(store, r["run_id"])
            assert served.count("live-fallthrough") == r["llm_calls"]["live"]
            assert served.count("record") == r["llm_calls"]["recorded"]


def test_a_sim_run_has_no_record_to_serve(db_copy):
    res, out = _replay(db_copy, "sim", "--backbone", "record")
    assert res.exit_code == 2 and "recorded no model exchanges" in out["error"]
    res, out = _replay(db_copy, "none", "--backbone", "sim")  # a sim counterfactual of a model run
    assert res.exit_code == 0, res.output
    assert out["backbone"] == "sim" and out["counterfactual"] and "llm_calls" not in out["runs"][0]


def _verify(db, run_id):
    res = CliRunner().invoke(main, ["verify", "--db", str(db), run_id, "--json"], env=NO_ENDPOINT)
    return res, json.loads(res.stdout)


def test_verify_re_executes_a_model_run_from_its_own_record_without_an_endpoint(db_copy):
    for run_id in ("none", "evo"):
        res, out = _verify(db_copy, run_id)
        assert res.exit_code == 0, res.output
        assert out["ok"] and out["identical"] and out["complete"] and out["replayed_from_record"]
        assert out["backbone"] == "openai" and out["chain_intact"]


def test_verify_of_a_record_backbone_run(db_copy, cases, tmp_path):
    case_file = tmp_path / "cases.jsonl"
    case_file.write_text("".join(c.model_dump_json() + "\n" for c in cases))
    res = CliRunner().invoke(main, ["run", str(case_file), "--db", str(db_copy), "--backbone", "record",
                                    "--record-from", "evo", "--run-id", "evo-again", "--json"], env=NO_ENDPOINT)
    assert res.exit_code == 0, res.output
    res, out = _verify(db_copy, "evo-again")
    assert res.exit_code == 0 and out["identical"] and out["replayed_from_record"], res.output


def test_verify_checks_a_model_runs_chain_first(db_copy):
    import duckdb

    con = duckdb.connect(str(db_copy))
    seq, payload = con.execute("SELECT seq, payload FROM events WHERE run_id = 'evo' AND type = 'llm.exchange' "
                               "ORDER BY seq LIMIT 1").fetchone()
    forged = dict(json.loads(payload), response="forged reply")
    con.execute("UPDATE events SET payload = ? WHERE run_id = 'evo' AND seq = ?", [json.dumps(forged), seq])
    con.close()
    res, out = _verify(db_copy, "evo")
    assert res.exit_code == 1 and not out["chain_intact"] and out["chain_break_seq"] == seq
