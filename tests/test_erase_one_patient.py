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

ROOT = Path(__file__).resolve().parents[1]
CASE = json.loads((ROOT / "examples" / "cases.jsonl").read_text().splitlines()[0])


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


@pytest.fixture()
def wards(tmp_path) -> Path:
    db = tmp_path / "two.duckdb"
    _two_wards(db)
    return db


def test_a_case_id_two_wards_share_is_refused_listing_them(wards):
    code, out = cli_json("erase", "--db", wards, "--subject", "case:c1")
    assert code == 2 and "ward-7, ward-8" in out["error"] and "--run" in out["error"], out
    assert _verified(wards, "ward-7") == _verified(wards, "ward-8") == "verified"  # nothing erased


def test_dry_run_lists_and_destroys_nothing(wards):
    before = Path(f"{wards}.keys").read_bytes()
    code, out = cli_json("erase", "--db", wards, "--subject", "case:c1", "--run", "ward-7", "--dry-run")
    assert code == 0 and out["dry_run"] and out["runs"] == {"ward-7": ["c1"]} and out["cases"] == 1, out
    assert Path(f"{wards}.keys").read_bytes() == before
    assert _verified(wards, "ward-7") == "verified"


def test_run_picks_one_patient_and_the_other_is_untouched(wards):
    code, out = cli_json("erase", "--db", wards, "--subject", "case:c1", "--run", "ward-7")
    assert code == 0 and out["runs"] == {"ward-7": ["c1"]}, out
    assert _verified(wards, "ward-7") == "erased"
    assert _verified(wards, "ward-8") == "verified"  # the other ward's patient keeps their content
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
        _two_wards(db)
    code, out = cli_json("erase", "--db", db, "--subject", "case:c1", "--run", "ward-7")
    assert code == 2 and "older build" in out["error"] and "--every-run" in out["error"], out
    assert _verified(db, "ward-8") == "verified"
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
