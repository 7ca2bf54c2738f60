"""`grandrounds export`: faithful Parquet and JSON Lines copies of runs, and direct SQL on the file."""

from __future__ import annotations

import hashlib
import json

import duckdb
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.replay.stats import outcomes_of
from replay_fixtures import recorded_db  # noqa: F401
from grandrounds.store.canonical import canonical_json
from grandrounds.store import integrity
from grandrounds.store.eventstore import EventStore, event_line
from grandrounds.store.sealing import SEALED_KEY


def _export(db, *args):
    return CliRunner().invoke(main, ["export", "--db", str(db), *args, "--json"])


def test_jsonl_export_is_the_record_fingerprint_and_chain_included(recorded_db, tmp_path):
    out = tmp_path / "teach.jsonl"
    res = _export(recorded_db, "teach", "--out", str(out))
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    with EventStore(recorded_db, read_only=True) as store:
        assert len(rows) == summary["events"] == store.last_seq("teach") + 1
        assert summary["fingerprints"]["teach"] == store.fingerprint("teach")
        stored = store.read("teach")
    assert [r["seq"] for r in rows] == list(range(len(rows))) and {r["run_id"] for r in rows} == {"teach"}
    # The hash chain can be recomputed from the file alone (it covers the stored, sealed bytes); the
    # fingerprint covers plaintext, so sealed case content needs the database's key file to open.
    h, chain = hashlib.sha256(), integrity.genesis("teach")
    codec = store.codec
    assert codec is not None and any(SEALED_KEY in r["payload"] for r in rows)
    for r in rows:
        payload = canonical_json(r["payload"])
        chain = integrity.link(chain, 2, r["run_id"], r["seq"], r["type"], r["schema_version"], r["case_id"],
                               r["causation_seq"], payload, canonical_json(r["meta"]))
        assert chain == r["chain"]
        plain = canonical_json(codec.open(r["run_id"], r["seq"], r["type"], r["payload"], strict=True))
        h.update(event_line(r["seq"], r["type"], plain).encode() + b"\n")
    assert h.hexdigest() == summary["fingerprints"]["teach"]
    assert rows[5]["meta"] == stored[5].meta
    assert codec.open("teach", 5, rows[5]["type"], rows[5]["payload"]) == stored[5].payload


def test_parquet_export_of_chosen_runs(recorded_db, tmp_path):
    out = tmp_path / "two.parquet"
    res = _export(recorded_db, "teach", "teach-none", "--out", str(out))
    assert res.exit_code == 0, res.output
    con = duckdb.connect()
    counts = dict(con.execute(f"SELECT run_id, count(*) FROM read_parquet('{out}') GROUP BY run_id").fetchall())
    with EventStore(recorded_db, read_only=True) as store:
        assert counts == {"teach": store.last_seq("teach") + 1, "teach-none": store.last_seq("teach-none") + 1}
        first_answer = store.read("teach", types=["answer.given"])[0]
        payload, = con.execute(f"SELECT payload FROM read_parquet('{out}') WHERE run_id = 'teach' AND seq = ?",
                               [first_answer.seq]).fetchone()
        # The stored bytes: the answer is sealed, and opens with the database's key file.
        assert SEALED_KEY in json.loads(payload)
        assert store.open_payload("teach", first_answer.seq, "answer.given", payload) == first_answer.payload
    every = _export(recorded_db, "--all", "--out", str(tmp_path / "all.parquet"))
    assert set(json.loads(every.stdout)["runs"]) == {"src", "teach", "teach-none"}


def test_readme_sql_runs_on_the_duckdb_file(recorded_db):
    # The query the README shows: accuracy per run straight from the events table.
    con = duckdb.connect(str(recorded_db), read_only=True)
    rows = con.execute("""
        SELECT run_id,
               count(*) AS cases,
               avg(CASE WHEN (payload->>'$.correct')::BOOLEAN THEN 1 ELSE 0 END) AS accuracy
        FROM events
        WHERE type = 'case.completed'
        GROUP BY run_id
        ORDER BY run_id""").fetchall()
    followed = con.execute("""
        SELECT payload->>'$.source' AS source, count(*) AS answers
        FROM events
        WHERE run_id = 'teach' AND type = 'answer.given' AND payload->>'$.source' LIKE 'rule:%'
        GROUP BY source ORDER BY answers DESC, source""").fetchall()
    con.close()
    with EventStore(recorded_db, read_only=True) as store:
        for run_id, cases, accuracy in rows:
            results = outcomes_of(store, run_id)
            assert cases == len(results) and abs(accuracy - sum(results) / len(results)) < 1e-9
    assert followed[0] == ("rule:rule-00001", 4)


def test_export_bad_input(recorded_db, tmp_path):
    res = _export(recorded_db, "teach", "--out", str(tmp_path / "x.csv"))
    assert res.exit_code == 2 and "extension" in json.loads(res.stdout)["error"]
    res = _export(recorded_db, "ghost", "--out", str(tmp_path / "x.jsonl"))
    assert res.exit_code == 2 and "no run 'ghost'" in json.loads(res.stdout)["error"]
    res = _export(recorded_db, "--out", str(tmp_path / "x.jsonl"))
    assert res.exit_code == 2
