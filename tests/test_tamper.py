"""The tamper matrix: edits made to the DuckDB file behind the event store's back, each detected by
`verify` (without a key where the chain or re-execution can see it; with a signing key for the ones
only a signed head can: a log rewritten and re-chained from its genesis), or shown inert.

`ATTACKS` is also the table in the README's Integrity section and in the issue's closing note.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from grandrounds.app import make_cache, run_cases
from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.runs import RunSpec
from grandrounds.replay.execute import execute
from grandrounds.replay.verify import verify_run
from grandrounds.store import integrity
from grandrounds.store.canonical import canonical_json
from grandrounds.store.eventstore import EventStore
from grandrounds.store.signing import SigningKey, load_key, sign_head
from conftest import copy_db

ROOT = Path(__file__).resolve().parents[1]
KEY = SigningKey(b"k" * 32, "test")
ATTACKER_KEY = SigningKey(b"a" * 32, "attacker")
CASES = 4


@pytest.fixture(scope="module")
def signed_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tamper") / "signed.duckdb"
    cases = load_cases(ROOT / "examples" / "cases.jsonl")[0][:CASES]
    with EventStore(path) as store:
        run_cases(store, cases, RunSpec(policy=EvoMedAgentPolicy(), source="tamper"), run_id="r",
                  cache=make_cache(store))
        sign_head(store, "r", KEY)
    return path


def _rows(con, run_id="r"):
    return con.execute("SELECT run_id, seq, type, schema_version, case_id, causation_seq, payload, meta, chain "
                       "FROM events WHERE run_id = ? ORDER BY seq", [run_id]).fetchall()


def _rechain(con, run_id="r", version=2, sign_with: SigningKey | None = None):
    """What an attacker without the key can always do: recompute every chain value from the genesis."""
    chain = integrity.genesis(run_id, version)
    for r in _rows(con, run_id):
        chain = integrity.link(chain, version, run_id, r[1], r[2], r[3], r[4], r[5],
                               canonical_json(json.loads(r[6])), canonical_json(json.loads(r[7])))
        con.execute("UPDATE events SET chain = ? WHERE run_id = ? AND seq = ?", [chain, run_id, r[1]])


def _last_case(con):
    return con.execute("SELECT case_id FROM events WHERE run_id = 'r' AND type = 'case.completed' "
                       "ORDER BY seq DESC LIMIT 1").fetchone()[0]


def _max_seq(con):
    return con.execute("SELECT max(seq) FROM events WHERE run_id = 'r'").fetchone()[0]


def _seq_of(con, type_, nth=0):
    return con.execute("SELECT seq FROM events WHERE run_id = 'r' AND type = ? ORDER BY seq",
                       [type_]).fetchall()[nth][0]


def _edit_payload(con, type_="feedback.recorded"):
    seq = _seq_of(con, type_, 1)
    payload = json.loads(con.execute("SELECT payload FROM events WHERE run_id='r' AND seq=?", [seq]).fetchone()[0])
    payload["correct"] = not payload["correct"]
    con.execute("UPDATE events SET payload = ? WHERE run_id = 'r' AND seq = ?", [json.dumps(payload), seq])


def delete_last_event(con):
    con.execute("DELETE FROM events WHERE run_id = 'r' AND seq = ?", [_max_seq(con)])


def delete_last_three_events(con):
    con.execute("DELETE FROM events WHERE run_id = 'r' AND seq > ?", [_max_seq(con) - 3])


def delete_last_case(con):
    first = con.execute("SELECT min(seq) FROM events WHERE run_id = 'r' AND case_id = ?", [_last_case(con)]).fetchone()[0]
    con.execute("DELETE FROM events WHERE run_id = 'r' AND seq >= ?", [first])


def delete_last_case_and_rechain(con):
    delete_last_case(con)
    _rechain(con)


def delete_middle_event(con):
    con.execute("DELETE FROM events WHERE run_id = 'r' AND seq = ?", [_max_seq(con) // 2])


def rewrite_run_id(con):
    con.execute("UPDATE events SET run_id = 'r-renamed' WHERE run_id = 'r'")


def edit_meta(con):
    con.execute("UPDATE events SET meta = '{\"host\":\"elsewhere\"}' WHERE run_id = 'r' AND seq = 3")


def edit_meta_and_rechain(con):
    edit_meta(con)
    _rechain(con)


def edit_meta_and_rechain_as_v1(con):
    edit_meta(con)
    _rechain(con, version=1)


def edit_payload(con):
    _edit_payload(con)


def edit_payload_and_rechain(con):
    _edit_payload(con)
    _rechain(con)


def edit_type(con):
    con.execute("UPDATE events SET type = 'reflection.recorded' WHERE run_id = 'r' AND seq = ?",
                [_seq_of(con, "feedback.recorded", 1)])


def edit_schema_version(con):
    con.execute("UPDATE events SET schema_version = 1 WHERE run_id = 'r' AND seq = ?",
                [_seq_of(con, "feedback.recorded", 1)])


def edit_case_id(con):
    con.execute("UPDATE events SET case_id = 'someone-else' WHERE run_id = 'r' AND seq = ?",
                [_seq_of(con, "answer.given", 1)])


def edit_causation(con):
    con.execute("UPDATE events SET causation_seq = 0 WHERE run_id = 'r' AND seq = ?",
                [_seq_of(con, "answer.given", 1)])


def edit_chain_value(con):
    con.execute("UPDATE events SET chain = 'v2:' || repeat('0', 64) WHERE run_id = 'r' AND seq = 5")


def swap_two_events(con):
    a, b = _seq_of(con, "answer.given", 0), _seq_of(con, "answer.given", 1)
    con.execute("UPDATE events SET seq = -1 WHERE run_id = 'r' AND seq = ?", [a])
    con.execute("UPDATE events SET seq = ? WHERE run_id = 'r' AND seq = ?", [a, b])
    con.execute("UPDATE events SET seq = ? WHERE run_id = 'r' AND seq = -1", [b])


def append_forged_event(con):
    last = _rows(con)[-1]
    seq = last[1] + 1
    payload = canonical_json({"index": 0, "correct": True})
    chain = integrity.link(last[8], 2, "r", seq, "case.completed", 1, "forged", None, payload, "{}")
    con.execute("INSERT INTO events VALUES ('r', ?, 'case.completed', 1, 'forged', NULL, ?, '{}', ?)",
                [seq, payload, chain])


def delete_signed_head(con):
    con.execute("DELETE FROM signed_heads")


def resign_with_another_key(con):
    delete_last_case_and_rechain(con)
    with_key = con.execute("SELECT * FROM signed_heads").fetchone()
    assert with_key is not None


def reformat_payload_whitespace(con):
    seq = _seq_of(con, "feedback.recorded", 1)
    payload = con.execute("SELECT payload FROM events WHERE run_id='r' AND seq=?", [seq]).fetchone()[0]
    con.execute("UPDATE events SET payload = ? WHERE run_id = 'r' AND seq = ?",
                [json.dumps(json.loads(payload), indent=2), seq])


# (attack, run id verify is asked for, detected without a key, detected with the key)
ATTACKS = [
    (delete_last_event, "r", True, True),
    (delete_last_three_events, "r", True, True),
    (delete_last_case, "r", True, True),
    (delete_last_case_and_rechain, "r", True, True),
    (delete_middle_event, "r", True, True),
    (rewrite_run_id, "r-renamed", True, True),
    (edit_meta, "r", True, True),
    (edit_meta_and_rechain, "r", False, True),
    (edit_meta_and_rechain_as_v1, "r", False, True),
    (edit_payload, "r", True, True),
    (edit_payload_and_rechain, "r", True, True),
    (edit_type, "r", True, True),
    (edit_schema_version, "r", True, True),
    (edit_case_id, "r", True, True),
    (edit_causation, "r", True, True),
    (edit_chain_value, "r", True, True),
    (swap_two_events, "r", True, True),
    (append_forged_event, "r", True, True),
    (delete_signed_head, "r", False, True),
    (resign_with_another_key, "r", True, True),
]
INERT = [reformat_payload_whitespace]

# The reason codes `verify` reports for each probe, without the signing key and with it: the "no key" and
# "with signing key" columns of docs/trust.md's tamper matrix, which cites this test for them.
CODES = {
    "delete_last_event": (("incomplete",), ("incomplete", "head_mismatch")),
    "delete_last_three_events": (("incomplete",), ("incomplete", "head_mismatch")),
    "delete_last_case": (("incomplete",), ("incomplete", "head_mismatch")),
    "delete_last_case_and_rechain": (("incomplete",), ("incomplete", "head_mismatch")),
    "delete_middle_event": (("chain_broken", "incomplete", "diverged"),
                            ("chain_broken", "incomplete", "diverged", "head_mismatch")),
    "rewrite_run_id": (("chain_broken", "ciphertext_tampered"), ("chain_broken", "ciphertext_tampered", "head_absent")),
    "edit_meta": (("chain_broken",), ("chain_broken",)),
    "edit_meta_and_rechain": ((), ("head_mismatch",)),
    "edit_meta_and_rechain_as_v1": ((), ("head_mismatch",)),
    "edit_payload": (("chain_broken", "diverged"), ("chain_broken", "diverged")),
    "edit_payload_and_rechain": (("diverged",), ("diverged", "head_mismatch")),
    "edit_type": (("chain_broken", "diverged"), ("chain_broken", "diverged")),
    "edit_schema_version": (("chain_broken",), ("chain_broken",)),
    "edit_case_id": (("chain_broken",), ("chain_broken",)),
    "edit_causation": (("chain_broken",), ("chain_broken",)),
    "edit_chain_value": (("chain_broken",), ("chain_broken",)),
    "swap_two_events": (("chain_broken", "ciphertext_tampered"), ("chain_broken", "ciphertext_tampered")),
    "append_forged_event": (("diverged",), ("diverged", "head_mismatch")),
    "delete_signed_head": ((), ("head_absent",)),
    "resign_with_another_key": (("incomplete",), ("incomplete", "head_other_key")),
}
# The anchors' codes (`--expect` the untouched run's fingerprint, `--expect-head` its head chain value):
# the "anchors" column of the same matrix.
BOTH = ("expect_mismatch", "expect_head_mismatch")
ANCHORS = {
    "delete_last_event": BOTH, "delete_last_three_events": BOTH, "delete_last_case": BOTH,
    "delete_last_case_and_rechain": BOTH,
    "delete_middle_event": ("expect_mismatch",),  # the last row, and so the head, is untouched
    "rewrite_run_id": ("expect_unverifiable",),   # sealed rows no longer open under the new name
    "edit_meta": (), "edit_meta_and_rechain": ("expect_head_mismatch",),
    "edit_meta_and_rechain_as_v1": ("expect_head_mismatch",),
    "edit_payload": ("expect_mismatch",), "edit_payload_and_rechain": BOTH, "edit_type": ("expect_mismatch",),
    "edit_schema_version": (), "edit_case_id": (), "edit_causation": (), "edit_chain_value": (),
    "swap_two_events": ("expect_unverifiable",), "append_forged_event": BOTH, "delete_signed_head": (),
    "resign_with_another_key": BOTH,
}


def _tampered(signed_db: Path, tmp_path: Path, attack) -> Path:
    path = tmp_path / "tampered.duckdb"
    copy_db(signed_db, path)
    con = duckdb.connect(str(path))
    try:
        attack(con)
    finally:
        con.close()
    if attack is resign_with_another_key:
        with EventStore(path) as store:
            sign_head(store, "r", ATTACKER_KEY, force=True)  # an attacker replaces the head as they please
    return path


def _verify(path: Path, run_id: str, key):
    with EventStore(path) as store:
        return verify_run(store, run_id, make_cache(store), key=key)


def test_the_untouched_run_verifies_with_and_without_the_key(signed_db, tmp_path):
    for key in (None, KEY):
        out = _verify(signed_db, "r", key)
        assert out.ok and out.identical and out.complete and out.chain_version == 2, out
        assert out.signed_head.status == ("valid" if key else "not checked")


@pytest.mark.parametrize("attack,run_id,without_key,with_key", ATTACKS, ids=[a[0].__name__ for a in ATTACKS])
def test_tamper_matrix(signed_db, tmp_path, attack, run_id, without_key, with_key):
    path = _tampered(signed_db, tmp_path, attack)
    plain = _verify(path, run_id, None)
    keyed = _verify(path, run_id, KEY)
    assert (not plain.ok) is without_key, plain
    assert not keyed.ok and with_key, keyed
    # A run that is not whole is never called identical, key or not.
    if plain.complete is False:
        assert not plain.identical
    if not without_key:  # what only a signed head catches: the chain was recomputed
        assert plain.chain_intact and keyed.signed_head.status in ("log differs", "absent")
    assert (plain.reason_codes, keyed.reason_codes) == CODES[attack.__name__]
    untouched = _verify(signed_db, "r", None)
    with EventStore(path) as store:
        anchored = verify_run(store, run_id, make_cache(store), expect=untouched.fingerprint,
                              expect_head=untouched.chain_head)
    assert tuple(c for c in anchored.reason_codes if c.startswith("expect")) == ANCHORS[attack.__name__]


def test_the_matrix_names_every_probe():
    assert set(CODES) == set(ANCHORS) == {a[0].__name__ for a in ATTACKS}


@pytest.mark.parametrize("attack", INERT, ids=[a.__name__ for a in INERT])
def test_inert_edits_change_nothing_verify_relies_on(signed_db, tmp_path, attack):
    path = _tampered(signed_db, tmp_path, attack)
    out = _verify(path, "r", KEY)
    # The chain hashes canonical JSON: re-spacing a payload changes neither the chain nor the signed head.
    assert out.chain_intact and out.signed_head.status == "valid"


def test_a_legacy_v1_run_still_verifies_and_says_so(tmp_path):
    path = tmp_path / "legacy.duckdb"
    cases = load_cases(ROOT / "examples" / "cases.jsonl")[0][:3]
    with EventStore(path) as store:
        # What an older build wrote: no declared case count, no run.completed, a v1 chain.
        execute(store, make_cache(store), "old", RunSpec(policy=EvoMedAgentPolicy(), source="legacy"), cases,
                checkpoint=False, declared=None)
    con = duckdb.connect(str(path))
    _rechain(con, "old", version=1)
    con.close()
    out = _verify(path, "old", None)
    assert out.ok and out.chain_version == 1 and out.complete is None
    assert any("chain v1" in w for w in out.warnings) and any("legacy run" in w for w in out.warnings)


def test_cli_verify_exit_codes_and_key_sources(signed_db, tmp_path, monkeypatch):
    path = _tampered(signed_db, tmp_path, edit_meta_and_rechain)
    monkeypatch.delenv("GRANDROUNDS_SIGNING_KEY", raising=False)
    res = CliRunner().invoke(main, ["verify", "--db", str(path), "r", "--json"])
    assert res.exit_code == 0, res.output  # without the key a re-chained meta edit cannot be seen
    (tmp_path / "signing").mkdir()  # not beside the database: such a key file is refused (store/signing.py)
    key_file = tmp_path / "signing" / "signing.key"
    key_file.write_bytes(KEY.secret + b"\n")
    res = CliRunner().invoke(main, ["verify", "--db", str(path), "r", "--json", "--key-file", str(key_file)])
    out = json.loads(res.stdout)
    assert res.exit_code == 1 and out["signed_head"]["status"] == "log differs"
    monkeypatch.setenv("GRANDROUNDS_SIGNING_KEY", KEY.secret.decode())
    assert load_key().key_id == KEY.key_id
    res = CliRunner().invoke(main, ["verify", "--db", str(path), "r"])
    assert res.exit_code == 1 and "log differs" in res.output
    # A short key is bad input, and the key never lands in the file.
    monkeypatch.setenv("GRANDROUNDS_SIGNING_KEY", "short")
    res = CliRunner().invoke(main, ["verify", "--db", str(path), "r", "--json"])
    assert res.exit_code == 2
    assert KEY.secret not in path.read_bytes()


def test_docs_trust_shows_these_codes():
    """docs/trust.md's matrix rows for these probes are rendered from CODES and ANCHORS (and the sealed
    probes' SEALED_PROBES) by scripts/tamper_matrix.py: the page says what this test holds."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tamper_matrix", ROOT / "scripts" / "tamper_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0


def test_an_edited_matrix_code_is_caught(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("tamper_matrix", ROOT / "scripts" / "tamper_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    page = tmp_path / "trust.md"
    text = (ROOT / "docs" / "trust.md").read_text()
    row = "| edit a payload | `chain_broken`, `diverged` |"
    assert row in text
    page.write_text(text.replace(row, "| edit a payload | `chain_broken` |"))
    assert mod.main(["--check"], page=page) == 1
    assert mod.main([], page=page) == 0 and mod.main(["--check"], page=page) == 0


def test_an_edited_hostile_row_is_caught(tmp_path):
    """Issue 43's rows are the tests' HOSTILE rows: a result typed over on the page is a difference."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tamper_matrix", ROOT / "scripts" / "tamper_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    page = tmp_path / "trust.md"
    text = (ROOT / "docs" / "trust.md").read_text()
    said = '| exit 2; saying "ward-7, ward-8", "--run"; nothing written; verify: verified |'
    assert said in text
    page.write_text(text.replace(said, "| exit 0; both erased |"))
    assert mod.main(["--check"], page=page) == 1
    assert mod.main([], page=page) == 0 and said in page.read_text()
