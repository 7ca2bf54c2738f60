"""Anchors without a key (issue 32, item 3): `verify --expect FINGERPRINT` and `--expect-head CHAIN`
check a log against values published elsewhere, so a consistent forgery (a whole case deleted,
`run.started.cases` and `run.completed` rewritten, the chain recomputed: what an unkeyed chain cannot
see) fails; and `sign` does not silently replace a head another key signed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.store.canonical import canonical_json
from test_tamper import _rechain, delete_last_case
from cli_helpers import cli_json, example_cases


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> dict:
    """A run made by `grandrounds run`, and the two values it printed, as a paper or a ticket would quote."""
    d = tmp_path_factory.mktemp("anchors")
    cases = example_cases(d, 4)
    db = d / "a.duckdb"
    code, out = cli_json("run", cases, "--db", db, "--run-id", "r")
    assert code == 0, out
    return {"db": db, "fingerprint": out["fingerprint"], "chain_head": out["chain_head"]}


def _copy(published: dict, tmp_path: Path) -> Path:
    db = tmp_path / "copy.duckdb"
    shutil.copy(published["db"], db)
    shutil.copy(f"{published['db']}.keys", f"{db}.keys")
    return db


def forge_consistent_truncation(con) -> None:
    """Delete the last case, rewrite `run.started.cases` and `run.completed` to match, recompute the chain."""
    started = con.execute("SELECT payload FROM events WHERE run_id = 'r' AND seq = 0").fetchone()[0]
    completed = con.execute("SELECT seq, type, schema_version, case_id, causation_seq, payload, meta FROM events "
                            "WHERE run_id = 'r' AND type = 'run.completed'").fetchone()
    declared = json.loads(started)["cases"]
    delete_last_case(con)  # the last case's events and run.completed after them
    started = dict(json.loads(started), cases=declared - 1)
    con.execute("UPDATE events SET payload = ? WHERE run_id = 'r' AND seq = 0", [canonical_json(started)])
    last = con.execute("SELECT max(seq) FROM events WHERE run_id = 'r'").fetchone()[0]
    payload = dict(json.loads(completed[5]), cases=declared - 1)
    con.execute("INSERT INTO events VALUES ('r', ?, ?, ?, ?, ?, ?, ?, 'x')",
                [last + 1, completed[1], completed[2], completed[3], completed[4], canonical_json(payload), completed[6]])
    _rechain(con)


def test_the_printed_values_are_accepted(published, tmp_path):
    db = _copy(published, tmp_path)
    code, out = cli_json("verify", "--db", db, "r", "--expect", published["fingerprint"],
                     "--expect-head", published["chain_head"])
    assert code == 0 and out["ok"], out
    assert out["expect"]["ok"] and out["expect_head"]["ok"] and out["chain_head"] == published["chain_head"]
    code, out = cli_json("verify", "--db", db, "r", "--expect", published["fingerprint"].upper())
    assert code == 0, out  # hex is hex, whatever its case


def test_a_consistent_forgery_passes_the_chain_but_not_the_anchors(published, tmp_path):
    db = _copy(published, tmp_path)
    keys = tmp_path / "signing"  # a signing key is kept apart from the database (store/signing.py)
    keys.mkdir()
    key = keys / "signing.key"
    key.write_bytes(b"k" * 32)
    code, out = cli_json("sign", "--db", db, "r", "--key-file", key)
    assert code == 0, out
    con = duckdb.connect(str(db))
    try:
        forge_consistent_truncation(con)
    finally:
        con.close()
    code, plain = cli_json("verify", "--db", db, "r")
    # The documented limit of an unkeyed chain: the forgery is whole, chained and re-executes identically.
    assert code == 0 and plain["ok"] and plain["declared_cases"] == 3, plain
    code, out = cli_json("verify", "--db", db, "r", "--expect", published["fingerprint"])
    assert code == 1 and out["reason"] == "expect_mismatch" and out["reason_codes"] == ["expect_mismatch"], out
    assert out["expect"] == {"expected": published["fingerprint"], "actual": plain["fingerprint"], "ok": False}
    code, out = cli_json("verify", "--db", db, "r", "--expect-head", published["chain_head"])
    assert code == 1 and out["reason"] == "expect_head_mismatch", out
    res = CliRunner().invoke(main, ["verify", "--db", str(db), "r", "--expect", published["fingerprint"]])
    assert res.exit_code == 1 and "TAMPERED (fingerprint is not the published one)" in res.output
    # what a signed head adds: the forgery is not the log that was signed (docs/trust.md's row)
    code, out = cli_json("verify", "--db", db, "r", "--key-file", key)
    assert code == 1 and out["reason_codes"] == ["head_mismatch"], out


def test_plain_truncation_fails_the_head_anchor(published, tmp_path):
    db = _copy(published, tmp_path)
    con = duckdb.connect(str(db))
    try:
        con.execute("DELETE FROM events WHERE run_id = 'r' AND seq = (SELECT max(seq) FROM events)")
    finally:
        con.close()
    code, out = cli_json("verify", "--db", db, "r", "--expect-head", published["chain_head"],
                     "--expect", published["fingerprint"])
    assert code == 1 and {"expect_mismatch", "expect_head_mismatch"} <= set(out["reason_codes"]), out


@pytest.mark.parametrize("args", [["--expect", "abc"], ["--expect-head", "v3:" + "0" * 64],
                                  ["--expect", "g" * 64]])
def test_a_malformed_anchor_is_bad_input(published, tmp_path, args):
    code, out = cli_json("verify", "--db", _copy(published, tmp_path), "r", *args)
    assert code == 2 and args[0] in out["error"], out


def test_sign_does_not_replace_another_keys_head_without_force(published, tmp_path):
    db = _copy(published, tmp_path)
    keys = tmp_path / "signing-keys"  # a signing key is never kept in the database's folder (store/signing.py)
    keys.mkdir()
    first, second = keys / "first.key", keys / "second.key"
    first.write_bytes(b"f" * 32)
    second.write_bytes(b"s" * 32)
    code, out = cli_json("sign", "--db", db, "r", "--key-file", first)
    assert code == 0, out
    first_id = out["key_id"]
    code, out = cli_json("sign", "--db", db, "r", "--key-file", first)  # the same key again: fine
    assert code == 0 and out["replaced"] == {}, out
    code, out = cli_json("sign", "--db", db, "r", "--key-file", second)
    assert code == 2 and first_id in out["error"] and "--force" in out["error"], out
    code, out = cli_json("verify", "--db", db, "r", "--key-file", first)
    assert code == 0 and out["signed_head"]["status"] == "valid", out  # still the first key's head
    code, out = cli_json("sign", "--db", db, "--all", "--key-file", second)
    assert code == 2 and first_id in out["error"], out
    code, out = cli_json("sign", "--db", db, "r", "--key-file", second, "--force")
    assert code == 0 and out["replaced"]["r"]["key_id"] == first_id, out
    res = CliRunner().invoke(main, ["sign", "--db", str(db), "r", "--key-file", str(first), "--force"])
    assert res.exit_code == 0 and f"replaced the head signed by key {out['key_id']}" in res.output
