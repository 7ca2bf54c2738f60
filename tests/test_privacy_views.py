"""Erasing a MedAgentBench patient, end to end, and what every view shows afterwards.

A FHIR run (sim backbone, the local sandbox) and an MCQ run share one database. Patient S6534835 (the
subject of task1_1: its `eval_mrn`) is erased with `grandrounds erase`. Then: the chain still verifies,
`verify` names the case that can no longer be re-executed, `replay` refuses it by name, audit and the
web view show its content as "[erased]" and the de-identification placeholders by type, `export` carries
none of the patient's text, and the other run's fingerprint is unchanged (and still re-executes).
Sealing is deterministic: the same run with the same key file in another process stores the same bytes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from conftest import EXAMPLES, MAB_PATIENTS as PATIENTS, needs_medagentbench
from fhir_helpers import offline_tasks_file, run_fhir
from grandrounds.cli import main
from grandrounds.store.eventstore import EventStore
from grandrounds.store.sealing import ERASED, SEALED_KEY
from grandrounds.handlers.deidentify import MEANINGS, PLACEHOLDERS
from grandrounds.ui.app import create_app, marked
from test_privacy_identifiers import _found, identifiers

pytestmark = needs_medagentbench

ERASED_MRN = "S6534835"
ERASED_CASE = "mab-task1_1"


def _cli(*args: str) -> tuple[int, dict]:
    r = CliRunner().invoke(main, [*args, "--json"])
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return r.exit_code, (json.loads(lines[-1]) if lines else {"output": r.output})


@pytest.fixture(scope="module")
def erased(tmp_path_factory):
    root = tmp_path_factory.mktemp("erase")
    db = root / "runs.duckdb"
    code, fhir = run_fhir(offline_tasks_file(root), db, "--policy", "evo-medagent")
    assert code == 0, fhir
    mcq_cases = root / "mcq.jsonl"
    mcq_cases.write_text("".join(EXAMPLES.read_text(encoding="utf-8").splitlines(keepends=True)[:4]))
    code, mcq = _cli("run", str(mcq_cases), "--db", str(db), "--run-id", "mcq")
    assert code == 0, mcq
    with EventStore(db) as store:
        before = {r: store.fingerprint(r) for r in (fhir["run_id"], "mcq")}
        instruction = store.read(fhir["run_id"], case_id=ERASED_CASE, types=["case.received"])[0].payload["case"]
    code, out = _cli("erase", "--db", str(db), "--subject", ERASED_MRN)
    assert code == 0, out
    assert out["runs"] == {fhir["run_id"]: [ERASED_CASE]}, out
    patient = next(p for p in json.loads(PATIENTS.read_text()) if p["id"] == ERASED_MRN)
    return {"db": db, "run": fhir["run_id"], "before": before, "ids": identifiers(patient),
            "instruction": instruction["instruction"], "mcq_cases": mcq_cases, "root": root}


def test_chain_fingerprints_verify_and_replay_after_the_erasure(erased):
    db, run = erased["db"], erased["run"]
    with EventStore(db) as store:
        assert store.verify_chain(run) is None and store.verify_chain("mcq") is None
        assert store.fingerprint(run) == erased["before"][run]  # the one recorded at the erasure
        assert store.fingerprint("mcq") == erased["before"]["mcq"]  # computed, unchanged
    code, v = _cli("verify", "--db", str(db), run)
    assert code != 0 and not v["ok"] and not v["reexecutable"] and v["chain_intact"], v
    assert v["erased_cases"] == [ERASED_CASE] and any(ERASED_CASE in r for r in v["reasons"])
    text = CliRunner().invoke(main, ["verify", "--db", str(db), run])  # the human rendering of the same
    assert text.exit_code == 1 and "CONTENT ERASED" in text.output and ERASED_CASE in text.output, text.output
    code, v = _cli("verify", "--db", str(db), "mcq")
    assert code == 0 and v["identical"] and v["fingerprint"] == erased["before"]["mcq"], v
    code, r = _cli("replay", "--db", str(db), "--from", run, "--permutations", "1")
    assert code == 2 and ERASED_CASE in r["error"] and "erased" in r["error"], r


def test_audit_and_export_carry_nothing_of_the_erased_patient(erased):
    db, run, ids = erased["db"], erased["run"], erased["ids"]
    code, x = _cli("audit", "explain", "--db", str(db), run, ERASED_CASE)
    assert code == 0 and x["content_erased"] and x["case"] == {"erased": ERASED}, x
    text = json.dumps(x)
    assert not _found(text, ids) and erased["instruction"][:40] not in text
    out = erased["root"] / "export.jsonl"
    code, summary = _cli("export", "--db", str(db), run, "--out", str(out))
    assert code == 0, summary
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    dump = out.read_text()
    assert not _found(dump, ids), _found(dump, ids)  # no row of any case names the patient
    own = [r for r in rows if r["case_id"] == ERASED_CASE]
    assert own and any(SEALED_KEY in r["payload"] for r in own)
    assert erased["instruction"][:40] not in json.dumps(own)
    # The ciphertext in the export cannot be opened: the patient's key is gone from the key file.
    ref = next(r["payload"][SEALED_KEY]["s"] for r in own if SEALED_KEY in r["payload"])
    keys = Path(str(db) + ".keys").read_text().splitlines()
    assert not any(ref in line and '"key"' in line for line in keys) and any(ref in line for line in keys)


def test_web_view_shows_erased_content_and_placeholders_as_such(erased):
    db, run, ids = erased["db"], erased["run"], erased["ids"]
    with TestClient(create_app(db)) as client:
        page = client.get(f"/runs/{run}/cases/{ERASED_CASE}")
        assert page.status_code == 200
        assert 'id="erased-note"' in page.text and 'class="redacted erased"' in page.text
        assert not _found(page.text, ids) and erased["instruction"][:40] not in page.text
        # Another patient's case: what memory gave it carries placeholders, shown by type.
        later = client.get(f"/runs/{run}/cases/mab-task1_2")
        assert later.status_code == 200 and 'id="erased-note"' not in later.text
        assert 'data-placeholder="' in later.text
        assert not _found(later.text, ids)
        memory = client.get(f"/runs/{run}/memory")
        assert memory.status_code == 200 and not _found(memory.text, ids)


def test_marked_filter_escapes_and_labels():
    html = str(marked("<b>x</b> [NAME] was seen on [DATE]; [erased] [NOT-A-TYPE]"))
    assert "&lt;b&gt;" in html and "<b>" not in html
    assert 'data-placeholder="NAME"' in html and 'data-placeholder="DATE"' in html
    assert 'class="redacted erased"' in html and "[NOT-A-TYPE]" in html and 'data-placeholder="NOT' not in html


def test_every_placeholder_is_titled_with_what_it_stands_for():
    assert MEANINGS.keys() == PLACEHOLDERS.keys()
    html = str(marked("seen at 93 [AGE 90+] in [PLACE] by [NAME]; [...]; call [CONTACT]"))
    assert 'data-placeholder="AGE 90+" title="An age over 89 was removed' in html
    assert 'data-placeholder="PLACE" title="A place was removed' in html
    assert 'title="A person&#39;s name was removed' in html
    assert 'data-placeholder="..." title="A word fewer than k patients' in html
    assert 'data-placeholder="CONTACT" title="A phone, fax or e-mail contact was removed' in html


def test_same_key_file_same_sealed_bytes_in_another_process(erased, tmp_path):
    """Nonces are derived (run, seq, type), never drawn: the MCQ run re-run in a fresh process against a
    copy of the key file stores byte-identical sealed payloads (meta, and so the chain, hold wall-clock
    times and differ)."""
    db2 = tmp_path / "again.duckdb"
    shutil.copy(str(erased["db"]) + ".keys", str(db2) + ".keys")
    env = dict(os.environ, PYTHONHASHSEED="7")
    res = subprocess.run([sys.executable, "-m", "grandrounds", "run", str(erased["mcq_cases"]), "--db", str(db2),
                          "--run-id", "mcq", "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    with EventStore(erased["db"], read_only=True) as a, EventStore(db2, read_only=True) as b:
        rows_a = a.conn.execute("SELECT seq, CAST(payload AS VARCHAR) FROM events WHERE run_id = 'mcq' ORDER BY seq").fetchall()
        rows_b = b.conn.execute("SELECT seq, CAST(payload AS VARCHAR) FROM events WHERE run_id = 'mcq' ORDER BY seq").fetchall()
        assert any(SEALED_KEY in p for _, p in rows_a)
        assert rows_a == rows_b
        assert b.fingerprint("mcq") == erased["before"]["mcq"]
