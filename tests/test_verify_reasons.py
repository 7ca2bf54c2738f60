"""`verify` names the cause (issue 32, item 2): erased (a tombstone), key missing, ciphertext that fails
authentication, chain break, divergence, incomplete run, signed-head faults, each with its own reason
code in `--json`. A flipped ciphertext byte, swapped rows or a deleted-and-renumbered middle row used to
read "the content of N case(s) was erased (grandrounds erase)": they are tampering, and say so."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from conftest import copy_db
from grandrounds.app import make_cache, run_cases
from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.runs import RunSpec
from grandrounds.replay.verify import REASON_ORDER, VerifyResult, verify_run
from grandrounds.store.erasure import erase_subject
from grandrounds.store.eventstore import EventStore
from grandrounds.store.signing import SigningKey, sign_head
from test_tamper import _rechain, _seq_of, delete_last_case, edit_meta, edit_payload_and_rechain, swap_two_events

ROOT = Path(__file__).resolve().parents[1]
KEY = SigningKey(b"k" * 32, "test")
OTHER_KEY = SigningKey(b"o" * 32, "other")


@pytest.fixture(scope="module")
def sealed_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("reasons") / "sealed.duckdb"
    cases = load_cases(ROOT / "examples" / "cases.jsonl")[0][:4]
    with EventStore(path) as store:
        assert store.codec is not None  # case content is sealed: the probes below are about that
        run_cases(store, cases, RunSpec(policy=EvoMedAgentPolicy(), source="reasons"), run_id="r",
                  cache=make_cache(store))
        sign_head(store, "r", KEY)
    return path


def _copy(sealed_db: Path, tmp_path: Path, edit=None) -> Path:
    path = copy_db(sealed_db, tmp_path / "t.duckdb")
    if edit is not None:
        con = duckdb.connect(str(path))
        try:
            edit(con)
        finally:
            con.close()
    return path


def _verify(path: Path, key=None) -> VerifyResult:
    with EventStore(path, read_only=True) as store:
        return verify_run(store, "r", make_cache(store), key=key)


def _flip_ciphertext(con, type_="case.received", nth=1):
    seq = _seq_of(con, type_, nth)
    payload = json.loads(con.execute("SELECT payload FROM events WHERE run_id='r' AND seq=?", [seq]).fetchone()[0])
    raw = bytearray(base64.b64decode(payload["$sealed"]["c"]))
    raw[5] ^= 0x01
    payload["$sealed"]["c"] = base64.b64encode(bytes(raw)).decode()
    con.execute("UPDATE events SET payload = ? WHERE run_id = 'r' AND seq = ?", [json.dumps(payload), seq])


def flip_ciphertext_byte(con):
    _flip_ciphertext(con)


def flip_ciphertext_byte_and_rechain(con):
    _flip_ciphertext(con)
    _rechain(con)


def delete_middle_event_and_renumber(con):
    middle = _seq_of(con, "answer.given", 1)
    con.execute("DELETE FROM events WHERE run_id = 'r' AND seq = ?", [middle])
    # two steps: DuckDB checks the primary key row by row
    con.execute("UPDATE events SET seq = -seq WHERE run_id = 'r' AND seq > ?", [middle])
    con.execute("UPDATE events SET seq = -seq - 1 WHERE run_id = 'r' AND seq < 0")
    con.execute("UPDATE events SET causation_seq = causation_seq - 1 WHERE run_id = 'r' AND causation_seq > ?",
                [middle])
    _rechain(con)


def _assert_not_called_erased(out: VerifyResult) -> None:
    assert "erased" not in out.reason_codes and not out.erased_cases, out
    assert not any("grandrounds erase" in r or "was erased" in r for r in out.reasons), out.reasons


def test_the_untouched_run_has_no_reason(sealed_db):
    out = _verify(sealed_db, KEY)
    assert out.ok and out.reason is None and out.reason_codes == (), out


# The codes of docs/trust.md's tamper matrix for these probes: without the key, with it, and the anchors'
# (`--expect` / `--expect-head` with the untouched run's values).
SEALED_PROBES = {
    "flip_ciphertext_byte": (("chain_broken", "ciphertext_tampered"), ("chain_broken", "ciphertext_tampered"),
                             ("expect_unverifiable",)),
    "flip_ciphertext_byte_and_rechain": (("ciphertext_tampered",), ("ciphertext_tampered", "head_mismatch"),
                                         ("expect_unverifiable", "expect_head_mismatch")),
    "swap_two_events": (("chain_broken", "ciphertext_tampered"), ("chain_broken", "ciphertext_tampered"),
                        ("expect_unverifiable",)),
    "delete_middle_event_and_renumber": (("ciphertext_tampered",), ("ciphertext_tampered", "head_mismatch"),
                                         ("expect_unverifiable", "expect_head_mismatch")),
}


@pytest.mark.parametrize("edit,chain_intact", [(flip_ciphertext_byte, False), (flip_ciphertext_byte_and_rechain, True),
                                               (swap_two_events, False), (delete_middle_event_and_renumber, True)],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_sealed_row_edited_or_moved_is_tampering_not_an_erasure(sealed_db, tmp_path, edit, chain_intact):
    path = _copy(sealed_db, tmp_path, edit)
    out = _verify(path)
    assert not out.ok and out.chain_intact is chain_intact, out
    assert "ciphertext_tampered" in out.reason_codes and out.unreadable_seqs["ciphertext_tampered"], out
    assert out.reason == ("ciphertext_tampered" if chain_intact else "chain_broken"), out
    _assert_not_called_erased(out)
    untouched = _verify(sealed_db, KEY)
    with EventStore(path) as store:
        anchored = verify_run(store, "r", make_cache(store), expect=untouched.fingerprint,
                              expect_head=untouched.chain_head)
    plain, keyed, anchors = SEALED_PROBES[edit.__name__]
    assert out.reason_codes == plain and _verify(path, KEY).reason_codes == keyed
    assert tuple(c for c in anchored.reason_codes if c.startswith("expect")) == anchors


def test_human_verdict_names_tampering(sealed_db, tmp_path):
    path = _copy(sealed_db, tmp_path, flip_ciphertext_byte_and_rechain)
    res = CliRunner().invoke(main, ["verify", "--db", str(path), "r"])
    assert res.exit_code == 1
    assert "TAMPERED (sealed content fails authentication)" in res.output and "erased" not in res.output.lower()


def test_a_subject_key_missing_from_the_key_file_is_key_missing(sealed_db, tmp_path):
    path = _copy(sealed_db, tmp_path)
    keys = Path(f"{path}.keys")
    lines = keys.read_text().splitlines(keepends=True)
    dropped = next(i for i, line in enumerate(lines) if '"ref"' in line)
    keys.write_text("".join(lines[:dropped] + lines[dropped + 1:]))  # a key file that lost a line
    out = _verify(path)
    assert out.reason == "key_missing" and out.reason_codes == ("key_missing",), out
    assert str(keys) in out.reasons[0]
    _assert_not_called_erased(out)


def test_an_erased_subject_is_erased(sealed_db, tmp_path):
    path = _copy(sealed_db, tmp_path)
    with EventStore(path) as store:
        first = store.read("r", upto_seq=5)[1].case_id
        erase_subject(store, f"case:{first}")
    out = _verify(path)
    assert out.reason == "erased" and out.reason_codes == ("erased",) and out.erased_cases == (first,), out
    assert out.fingerprint is not None  # the one recorded at the erasure
    # docs/trust.md's row: the signed head stays valid, and `--expect` the published fingerprint passes
    untouched = _verify(sealed_db, KEY)
    assert _verify(path, KEY).signed_head.status == "valid"
    with EventStore(path) as store:
        anchored = verify_run(store, "r", make_cache(store), expect=untouched.fingerprint)
    assert anchored.expect.ok and "expect_mismatch" not in anchored.reason_codes, anchored


@pytest.mark.parametrize("edit,code", [(edit_meta, "chain_broken"), (edit_payload_and_rechain, "diverged"),
                                       (delete_last_case, "incomplete")],
                         ids=["chain_broken", "diverged", "incomplete"])
def test_chain_divergence_and_incomplete_each_have_their_code(sealed_db, tmp_path, edit, code):
    out = _verify(_copy(sealed_db, tmp_path, edit))
    assert out.reason == code and code in out.reason_codes, out
    _assert_not_called_erased(out)


def test_signed_head_faults_have_their_codes(sealed_db, tmp_path):
    path = _copy(sealed_db, tmp_path, lambda con: con.execute("DELETE FROM signed_heads"))
    assert _verify(path, KEY).reason == "head_absent"
    # a field of the signed head edited (its MAC no longer covers it): the log itself is untouched
    path = _copy(sealed_db, tmp_path, lambda con: con.execute("UPDATE signed_heads SET events = events + 1"))
    out = _verify(path, KEY)
    assert out.reason == "head_bad_signature" and out.reason_codes == ("head_bad_signature",), out
    path = _copy(sealed_db, tmp_path)
    with EventStore(path) as store:
        sign_head(store, "r", OTHER_KEY, force=True)
    assert _verify(path, KEY).reason == "head_other_key"
    path = _copy(sealed_db, tmp_path, delete_last_case)
    _rechain_path = duckdb.connect(str(path))
    try:
        _rechain(_rechain_path)
    finally:
        _rechain_path.close()
    out = _verify(path, KEY)
    assert "head_mismatch" in out.reason_codes, out


def test_every_code_is_documented():
    text = (ROOT / "docs" / "trust.md").read_text()
    missing = [c for c in REASON_ORDER if f"`{c}`" not in text]
    assert not missing, f"docs/trust.md lacks reason codes {missing}"
