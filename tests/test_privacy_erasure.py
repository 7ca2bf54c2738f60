"""Right to erasure by crypto-shredding: case content is sealed per subject in a database file, and
`grandrounds erase --subject` destroys the key. Afterwards the chain verifies, audit and export show the
content as erased, verify and replay name the cases that can no longer be re-executed, and no other
run's fingerprint changes."""

from __future__ import annotations

import json

from click.testing import CliRunner

from conftest import run_in
from grandrounds.cli import main
from grandrounds.store.erasure import erased_cases
from grandrounds.store.eventstore import EventStore
from grandrounds.store.sealing import ERASED, SEALED_KEY


def _cli(*args) -> tuple[int, dict]:
    r = CliRunner().invoke(main, [*args, "--json"])
    lines = r.stdout.strip().splitlines()
    return r.exit_code, (json.loads(lines[-1]) if lines else {"output": r.output})


def test_sealed_at_rest_same_fingerprint_as_clear(example_cases, evo_spec, tmp_path):
    cases = example_cases[:4]
    with EventStore(tmp_path / "sealed.duckdb") as sealed, EventStore(":memory:") as clear:
        assert sealed.codec is not None and clear.codec is None
        run_in(sealed, cases, evo_spec, "r")
        run_in(clear, cases, evo_spec, "r")
        assert sealed.fingerprint("r") == clear.fingerprint("r")  # over plaintext: encryption changes no bytes
        assert [e.payload for e in sealed.read("r")] == [e.payload for e in clear.read("r")]
        raw = sealed.conn.execute("SELECT string_agg(CAST(payload AS VARCHAR), ' ') FROM events "
                                  "WHERE type = 'case.received'").fetchone()[0]
        assert SEALED_KEY in raw and cases[0].question[:40] not in raw
        assert sealed.verify_chain("r") is None
    keys = (tmp_path / "sealed.duckdb.keys").read_text()
    assert (tmp_path / "sealed.duckdb.keys").stat().st_mode & 0o077 == 0
    assert cases[0].case_id not in keys  # subjects are named by an HMAC reference only


def test_erase_a_subject(example_cases, evo_spec, tmp_path):
    db = tmp_path / "runs.duckdb"
    first, other = example_cases[:5], example_cases[5:9]
    with EventStore(db) as store:
        run_in(store, first, evo_spec, "a", declare=True)
        run_in(store, other, evo_spec, "b", declare=True)
        before = {r: store.fingerprint(r) for r in ("a", "b")}
    gone = first[1]

    code, out = _cli("erase", "--db", str(db), "--subject", f"case:{gone.case_id}")
    assert code == 0, out
    assert out["runs"] == {"a": [gone.case_id]} and out["fingerprints_recorded"] == {"a": before["a"]}
    code, again = _cli("erase", "--db", str(db), "--subject", f"case:{gone.case_id}")
    assert code == 2 and "already erased" in again["error"]

    with EventStore(db) as store:
        assert store.verify_chain("a") is None and store.verify_chain("b") is None  # stored bytes untouched
        assert {r: store.fingerprint(r) for r in ("a", "b")} == before  # b computed, a as recorded
        assert erased_cases(store, "a") == [gone.case_id] and erased_cases(store, "b") == []
        events = store.read("a", case_id=gone.case_id)
        assert events[0].payload["case"] == {"erased": ERASED}
        answer = next(e for e in events if e.type == "answer.given").payload
        assert answer["answer"] == ERASED and answer["steps"] == []
        kept = store.read("a", case_id=first[0].case_id)[0].payload["case"]
        assert kept["question"] == first[0].question  # the other subjects still read

    code, explained = _cli("audit", "explain", "--db", str(db), "a", gone.case_id)
    assert code == 0, explained
    assert explained["content_erased"] and explained["answer"] == ERASED
    assert gone.question[:30] not in json.dumps(explained)

    out_file = tmp_path / "a.jsonl"
    code, exported = _cli("export", "--db", str(db), "a", "--out", str(out_file))
    assert code == 0, exported
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    of_gone = json.dumps([r for r in rows if r["case_id"] == gone.case_id])
    assert of_gone and gone.question[:30] not in of_gone and gone.question[-30:] not in of_gone
    assert any(SEALED_KEY in r["payload"] for r in rows if r["case_id"] == gone.case_id)
    # Other cases' rows keep what *they* were shown (a later case's retrieved precedent quotes the
    # erased case), sealed under their own subjects: README, "Erasure", limits. Nothing is in clear.
    assert gone.question[:30] not in out_file.read_text()
    # The exported ciphertext cannot be opened any more: its key is gone from the key file.
    ref = out["subject_ref"]
    assert ref not in json.dumps([l for l in (tmp_path / "runs.duckdb.keys").read_text().splitlines()
                                  if '"key"' in l])

    code, verified = _cli("verify", "--db", str(db), "a")
    assert code != 0 or not verified.get("ok")
    assert verified["erased_cases"] == [gone.case_id] and verified["chain_intact"] and not verified["reexecutable"]
    code, other_verified = _cli("verify", "--db", str(db), "b")
    assert code == 0 and other_verified["identical"], other_verified

    code, replayed = _cli("replay", "--db", str(db), "--from", "a", "--permutations", "1")
    assert code == 2 and gone.case_id in replayed["error"] and "erased" in replayed["error"]


def test_cases_about_one_subject_share_its_key(tmp_path):
    """A case's `subject` field (MedAgentBench: eval_mrn) names whose key seals it; erasing the subject
    erases every case about them, and nothing of another subject."""
    from grandrounds.store.events import NewEvent
    from grandrounds.store.event_types import CaseReceived
    from grandrounds.handlers.cases import Case

    def case(cid, subject):
        return Case(case_id=cid, kind="mcq", question=f"question of {cid}", options={"A": "x", "B": "y"},
                    answer="A", subject=subject)

    db = tmp_path / "s.duckdb"
    with EventStore(db) as store:
        cs = [case("c1", "p1"), case("c2", "p1"), case("c3", "p2")]
        store.append("r", [NewEvent(CaseReceived(index=i, case=c.model_dump(mode="json")), case_id=c.case_id)
                           for i, c in enumerate(cs)], -1)
        fp = store.fingerprint("r")
    code, out = _cli("erase", "--db", str(db), "--subject", "p1")
    assert code == 0 and out["runs"] == {"r": ["c1", "c2"]}, out
    with EventStore(db) as store:
        cases = [e.payload["case"] for e in store.read("r")]
        assert cases[:2] == [{"erased": ERASED}] * 2 and cases[2]["question"] == "question of c3"
        assert store.verify_chain("r") is None and store.fingerprint("r") == fp
    code, out = _cli("erase", "--db", str(db), "--subject", "nobody")
    assert code == 2 and "no content" in out["error"]
