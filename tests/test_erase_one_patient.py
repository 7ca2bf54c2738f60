"""Erasure reaches one patient (issue 43, part 2).

Before: `grandrounds erase --subject case:c1` erased the case `c1` of two namespaces (`ward-7`, `ward-8`):
two different patients, sealed under one key. Now a case that names no subject is its own subject within
its run (store/sealing.py `default_subject`); a case id several runs hold is refused, listing them, unless
`--run` picks one or `--every-run` says all; `--dry-run` lists what would go. Rows an older build sealed
under the shared `case:ID` key keep that meaning: they can only go together, and `erase` says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import cli_json
from grandrounds import Memory
from grandrounds.store import sealing
from hostile_rows import Hostile

ROOT = Path(__file__).resolve().parents[1]
CASE = json.loads((ROOT / "examples" / "cases.jsonl").read_text().splitlines()[0])
T = "tests/test_erase_one_patient.py::"
ERASE = "`erase --subject case:c1` where two namespaces (`ward-7`, `ward-8`) each hold a case `c1`"
HOSTILE = {  # the rows of docs/trust.md's hostile matrix these tests assert (verify: of each ward named)
    "ambiguous": Hostile(ERASE + ": both wards", T + "test_a_case_id_two_wards_share_is_refused_listing_them",
                         "both patients erased", exit=2, says=("ward-7, ward-8", "--run"), written=False,
                         codes=()),
    "dry-run": Hostile(ERASE + ", `--run ward-7 --dry-run`: ward-7", T + "test_dry_run_lists_and_destroys_nothing",
                       "no such option", exit=0, written=False, codes=()),
    "one-ward": Hostile(ERASE + ", `--run ward-7`: ward-7",
                        T + "test_run_picks_one_patient_and_the_other_is_untouched", "no such option",
                        exit=0, codes=("erased",)),
    "other-ward": Hostile(ERASE + ", `--run ward-7`: ward-8",
                          T + "test_run_picks_one_patient_and_the_other_is_untouched", "erased", codes=()),
    "legacy": Hostile("the same, on an older build's log (one `case:c1` key for both), `--run ward-7`: ward-8",
                      T + "test_an_older_builds_shared_key_goes_only_together", "—",
                      exit=2, says=("older build", "--every-run"), codes=()),
}


def _two_wards(db: Path, subject: str | None = None) -> None:
    case = dict(CASE, case_id="c1", **({"subject": subject} if subject else {}))
    for ward in ("ward-7", "ward-8"):
        with Memory.open(db, namespace=ward, cases=1) as memory:
            memory.recall(case)
            memory.record("c1", answer="A")
            memory.feedback("c1", outcome=case["answer"])


def _verified(db: Path, run_id: str) -> str:
    code, out = cli_json("verify", "--db", db, run_id)
    return out["reason"] or "verified"


def _codes(db: Path, run_id: str) -> tuple[str, ...]:
    return tuple(cli_json("verify", "--db", db, run_id)[1]["reason_codes"])


@pytest.fixture()
def wards(tmp_path) -> Path:
    db = tmp_path / "two.duckdb"
    _two_wards(db)
    return db


def test_a_case_id_two_wards_share_is_refused_listing_them(wards):
    before, row = Path(f"{wards}.keys").read_bytes(), HOSTILE["ambiguous"]
    code, out = cli_json("erase", "--db", wards, "--subject", "case:c1")
    assert code == row.exit and row.said(out["error"]), out
    assert row.written is False and Path(f"{wards}.keys").read_bytes() == before
    assert _codes(wards, "ward-7") == _codes(wards, "ward-8") == row.codes  # nothing erased


def test_dry_run_lists_and_destroys_nothing(wards):
    before, row = Path(f"{wards}.keys").read_bytes(), HOSTILE["dry-run"]
    code, out = cli_json("erase", "--db", wards, "--subject", "case:c1", "--run", "ward-7", "--dry-run")
    assert code == row.exit and out["dry_run"] and out["runs"] == {"ward-7": ["c1"]} and out["cases"] == 1, out
    assert row.written is False and Path(f"{wards}.keys").read_bytes() == before
    assert _codes(wards, "ward-7") == row.codes


def test_run_picks_one_patient_and_the_other_is_untouched(wards):
    code, out = cli_json("erase", "--db", wards, "--subject", "case:c1", "--run", "ward-7")
    assert code == HOSTILE["one-ward"].exit and out["runs"] == {"ward-7": ["c1"]}, out
    assert _codes(wards, "ward-7") == HOSTILE["one-ward"].codes
    assert _codes(wards, "ward-8") == HOSTILE["other-ward"].codes  # the other ward's patient keeps their content
    code, out = cli_json("erase", "--db", wards, "--subject", "case:c1", "--run", "ward-7")
    assert code == 2 and "already erased" in out["error"], out


def test_every_run_erases_the_case_in_each(wards):
    code, out = cli_json("erase", "--db", wards, "--subject", "case:c1", "--every-run")
    assert code == 0 and out["runs"] == {"ward-7": ["c1"], "ward-8": ["c1"]}, out
    assert _verified(wards, "ward-7") == _verified(wards, "ward-8") == "erased"


def test_a_named_subject_is_one_patient_across_runs(tmp_path):
    db = tmp_path / "named.duckdb"
    _two_wards(db, subject="patient-9")
    code, out = cli_json("erase", "--db", db, "--subject", "patient-9", "--run", "ward-7")
    assert code == 2 and "--run scopes a case's own subject" in out["error"], out
    code, out = cli_json("erase", "--db", db, "--subject", "patient-9")
    assert code == 0 and sorted(out["runs"]) == ["ward-7", "ward-8"], out


def test_an_older_builds_shared_key_goes_only_together(tmp_path, monkeypatch):
    db = tmp_path / "legacy.duckdb"
    with monkeypatch.context() as m:  # what the build before wrote: `case:c1` for every run's case c1
        m.setattr(sealing, "default_subject", lambda run_id, case_id: sealing.legacy_subject(case_id))
        m.setattr(sealing, "SUBJECT_SCHEME", 1)  # and its envelopes' scheme (those had no `v`: read as 1)
        _two_wards(db)
    code, out, row = *cli_json("erase", "--db", db, "--subject", "case:c1", "--run", "ward-7"), HOSTILE["legacy"]
    assert code == row.exit and row.said(out["error"]), out
    assert _codes(db, "ward-8") == row.codes
    code, out = cli_json("erase", "--db", db, "--subject", "case:c1", "--every-run")
    assert code == 0 and sorted(out["runs"]) == ["ward-7", "ward-8"], out


def test_a_single_runs_case_needs_no_run(tmp_path):
    db = tmp_path / "one.duckdb"
    case = dict(CASE, case_id="c1")
    with Memory.open(db, namespace="ward-7", cases=1) as memory:
        memory.recall(case)
        memory.record("c1", answer="A")
        memory.feedback("c1", outcome=case["answer"])
    code, out = cli_json("erase", "--db", db, "--subject", "case:c1")
    assert code == 0 and out["runs"] == {"ward-7": ["c1"]}, out


def test_each_sealed_row_records_its_subject_scheme(tmp_path):
    """Versioned: a row sealed now says scheme 2 (its case within its run); a row without `v` (an older
    build's) reads as scheme 1, so its `case:ID` keeps the meaning it was sealed under."""
    import duckdb

    db = tmp_path / "v.duckdb"
    _two_wards(db)
    con = duckdb.connect(str(db))
    try:
        schemes = {r[0] for r in con.execute(f"SELECT {sealing.SUBJECT_SCHEME_SQL} FROM events "
                                             f"WHERE {sealing.SUBJECT_REF_SQL} IS NOT NULL").fetchall()}
        old = con.execute(f"SELECT {sealing.SUBJECT_SCHEME_SQL} FROM (SELECT '{{\"$sealed\": {{\"s\": \"x\"}}}}' "
                          "AS payload)").fetchone()[0]
    finally:
        con.close()
    assert schemes == {sealing.SUBJECT_SCHEME} == {2} and old == 1
