"""Key custody (issue 32, item 1): nothing but the keyring writes a key file; every output path is checked
against the database, its WAL and its key file before anything is opened; key files stay 0600; a key
file that is missing or unreadable is an error naming it (exit 2), never "erased"; `grandrounds keys
backup/restore` copy it out and back without ever dropping a key or undoing an erasure."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.store.keyring import KeyRing
from cli_helpers import example_cases

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args, env: dict | None = None) -> tuple[int, dict, str]:
    res = CliRunner().invoke(main, [*map(str, args), "--json"], env=env)
    lines = res.stdout.strip().splitlines()
    return res.exit_code, (json.loads(lines[-1]) if lines else {}), res.output


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """A database written by `grandrounds run` (sealed content, its key file beside it)."""
    d = tmp_path_factory.mktemp("custody")
    cases = example_cases(d, 3)
    db = d / "e.duckdb"
    code, out, output = _cli("run", cases, "--db", db, "--run-id", "r")
    assert code == 0, output
    return {"db": db, "cases": cases, "run": out}


@pytest.fixture
def db(made, tmp_path) -> Path:
    path = tmp_path / "e.duckdb"
    shutil.copy(made["db"], path)
    shutil.copy(str(made["db"]) + ".keys", str(path) + ".keys")
    os.chmod(str(path) + ".keys", 0o600)
    return path


def test_export_onto_the_key_file_is_refused_and_the_key_file_is_untouched(db, tmp_path):
    keys = Path(str(db) + ".keys")
    before = _sha(keys)
    # The reported bug: written over the key file, then refused ("no key file header"), left 0644.
    code, out, _ = _cli("export", "r", "--db", db, "--out", keys, "--format", "jsonl", "--force")
    assert code == 2 and "key file" in out["error"], out
    # The same file under other names: a symlink, a hard link, $GRANDROUNDS_KEYS, a copy named .jsonl.
    (tmp_path / "link.keys").symlink_to(keys)
    os.link(keys, tmp_path / "hard.jsonl")
    shutil.copy(keys, tmp_path / "copy.jsonl")
    for target in (tmp_path / "link.keys", tmp_path / "hard.jsonl", tmp_path / "copy.jsonl"):
        code, out, _ = _cli("export", "r", "--db", db, "--out", target, "--format", "jsonl", "--force")
        assert code == 2 and "key file" in out["error"], (target, out)
    shared = tmp_path / "shared.keys"
    shutil.copy(keys, shared)
    os.chmod(shared, 0o600)
    shared_before = _sha(shared)
    env = {"GRANDROUNDS_KEYS": str(shared)}
    code, out, _ = _cli("export", "r", "--db", db, "--out", shared, "--format", "jsonl", "--force", env=env)
    assert code == 2 and "key file" in out["error"], out
    assert _sha(shared) == shared_before and _mode(shared) == 0o600
    # The WAL and the database itself, as before.
    for target in (Path(str(db) + ".wal"), db):
        code, out, _ = _cli("export", "r", "--db", db, "--out", target, "--format", "jsonl", "--force")
        assert code == 2, out
    assert _sha(keys) == before and _mode(keys) == 0o600
    assert not list(tmp_path.glob(".*partial*"))  # refused before the temporary was even created
    code, out, _ = _cli("export", "r", "--db", db, "--out", tmp_path / "fine.jsonl")
    assert code == 0 and out["fingerprints"]["r"], out


def test_replay_plot_and_report_and_convert_never_write_a_key_file(db, tmp_path):
    keys = Path(str(db) + ".keys")
    before = _sha(keys)
    for option in ("--plot", "--report"):
        code, out, _ = _cli("replay", "--db", db, "--from", "r", "--permutations", "1", option, keys)
        assert code == 2 and "key file" in out["error"], out
    code, out, _ = _cli("replay", "--db", db, "--from", "r", "--permutations", "1", "--plot", str(db) + ".wal")
    assert code == 2 and "write-ahead log" in out["error"], out
    code, out, _ = _cli("convert", ROOT / "examples" / "cases.jsonl", "--format", "chestagentbench", "--out", keys)
    assert code == 2 and "key file" in out["error"], out
    assert _sha(keys) == before and _mode(keys) == 0o600


def test_a_database_copied_without_its_key_file_names_the_file_never_erased(made, tmp_path):
    lone = tmp_path / "copied.duckdb"
    shutil.copy(made["db"], lone)  # what `cp e.duckdb backup/` does
    code, out, output = _cli("verify", "--db", lone, "r")
    assert code == 2, output
    assert f"key file {lone}.keys not found" in out["error"] and "copied without it" in out["error"]
    assert out["reason"] == "key_missing" and out["key_file"] == f"{lone}.keys"
    assert "erased" not in out["error"]
    code, out, _ = _cli("audit", "explain", "--db", lone, "r", "0")
    assert code == 2 and f"{lone}.keys not found" in out["error"], out
    code, out, _ = _cli("export", "r", "--db", lone, "--out", tmp_path / "x.jsonl")
    assert code == 2 and "not found" in out["error"] and not (tmp_path / "x.jsonl").exists(), out
    res = CliRunner().invoke(main, ["ui", "--db", str(lone), "--port", "0"])
    assert res.exit_code == 2 and f"{lone}.keys not found" in res.output  # said once, not a 500 on every page
    code, out, _ = _cli("erase", "--db", lone, "--subject", "case:ex-001")
    assert code == 2 and f"{lone}.keys not found" in out["error"], out  # not "no content of that subject"
    assert not Path(f"{lone}.keys").exists()  # a read is never a reason to make a key file
    shutil.copy(str(made["db"]) + ".keys", f"{lone}.keys")
    os.chmod(f"{lone}.keys", 0o644)  # what a careless copy leaves: verified, with a warning to fix it
    code, out, output = _cli("verify", "--db", lone, "r")
    assert code == 0 and out["ok"], output
    assert any("mode 644" in w and "chmod 600" in w for w in out["warnings"]), out["warnings"]


def test_a_key_file_that_cannot_be_read_is_named(made, tmp_path):
    db = tmp_path / "e.duckdb"
    shutil.copy(made["db"], db)
    Path(f"{db}.keys").write_bytes(b"\xff\xfe not a key file\n")
    code, out, _ = _cli("verify", "--db", db, "r")
    assert code == 2 and f"{db}.keys" in out["error"] and "erased" not in out["error"], out
    Path(f"{db}.keys").unlink()
    Path(f"{db}.keys").mkdir()
    code, out, _ = _cli("verify", "--db", db, "r")
    assert code == 2 and f"{db}.keys" in out["error"], out


def test_run_on_a_new_database_says_where_its_key_file_is(tmp_path, made):
    db = tmp_path / "new.duckdb"
    res = CliRunner().invoke(main, ["run", str(made["cases"]), "--db", str(db), "--run-id", "r"])
    assert res.exit_code == 0, res.output
    assert f"key file     {db}.keys" in res.output
    assert "losing it loses that content" in res.output and "grandrounds keys backup" in res.output
    code, out, _ = _cli("run", made["cases"], "--db", db, "--run-id", "r2")
    assert code == 0 and out["key_file"]["path"] == f"{db}.keys" and out["key_file"]["created"] is False
    code, out, _ = _cli("run", made["cases"], "--db", tmp_path / "other.duckdb", "--run-id", "r")
    assert out["key_file"] == {"path": f"{tmp_path / 'other.duckdb'}.keys", "created": True,
                               "warning": out["key_file"]["warning"]} and "losing it" in out["key_file"]["warning"]
    assert _mode(Path(f"{db}.keys")) == 0o600


def test_keys_backup_and_restore(db, tmp_path, made):
    keys = Path(f"{db}.keys")
    backup = tmp_path / "safe" / "e.keys.bak"
    backup.parent.mkdir()
    code, out, output = _cli("keys", "backup", "--db", db, "--out", backup)
    assert code == 0 and out["action"] == "written", output
    assert backup.read_bytes() == keys.read_bytes() and _mode(backup) == 0o600
    code, out, _ = _cli("keys", "backup", "--db", db, "--out", backup)
    assert code == 0 and out["action"].startswith("unchanged"), out
    for target in (keys, db, Path(f"{db}.wal")):  # never onto the key file, the database or its WAL
        code, out, _ = _cli("keys", "backup", "--db", db, "--out", target)
        assert code == 2, out
    assert keys.read_bytes() == backup.read_bytes()

    # Lost: verify names the file; restored: 0600, verified; restoring again changes nothing.
    keys.unlink()
    code, out, _ = _cli("verify", "--db", db, "r")
    assert code == 2 and out["reason"] == "key_missing"
    code, out, output = _cli("keys", "restore", "--db", db, backup)
    assert code == 0 and out["action"].startswith("written") and out["sealed_subjects_without_key"] == 0, output
    assert _mode(keys) == 0o600 and keys.read_bytes() == backup.read_bytes()
    code, out, _ = _cli("verify", "--db", db, "r")
    assert code == 0 and out["ok"], out
    code, out, _ = _cli("keys", "restore", "--db", db, backup)
    assert code == 0 and out["action"].startswith("unchanged"), out

    # Another database's key file is neither restored over this one's nor accepted as its backup.
    other = tmp_path / "other.duckdb"
    code, _, output = _cli("run", made["cases"], "--db", other, "--run-id", "r")
    assert code == 0, output
    before = keys.read_bytes()
    code, out, _ = _cli("keys", "restore", "--db", db, f"{other}.keys")
    assert code == 2 and keys.read_bytes() == before, out
    code, out, _ = _cli("keys", "backup", "--db", other, "--out", backup)
    assert code == 2 and "another secret" in out["error"] and backup.read_bytes() == before, out


def test_a_restore_never_undoes_an_erasure(db, tmp_path, made):
    keys = Path(f"{db}.keys")
    backup = tmp_path / "before-erase.keys"
    assert _cli("keys", "backup", "--db", db, "--out", backup)[0] == 0
    first = json.loads(made["cases"].read_text().splitlines()[0])["case_id"]
    code, out, _ = _cli("erase", "--db", db, "--subject", f"case:{first}")
    assert code == 0, out
    ref = out["subject_ref"]
    # The older backup still holds the erased key: restoring it over the key file is refused ...
    code, out, _ = _cli("keys", "restore", "--db", db, backup)
    assert code == 2 and "tombstone" in out["error"], out
    # ... and with the key file gone, it is restored without that key (the database records the erasure).
    keys.unlink()
    code, out, output = _cli("keys", "restore", "--db", db, backup)
    assert code == 0 and out["erased_keys_withheld"] == 1, output
    ring = KeyRing(keys)
    assert ring.key(ref) is None and ring.is_erased(ref) and _mode(keys) == 0o600
    code, out, _ = _cli("verify", "--db", db, "r")
    assert code == 1 and out["reason"] == "erased" and out["erased_cases"] == [first], out


def test_a_key_file_rewrite_is_0600_even_over_a_stale_temporary(tmp_path):
    ring = KeyRing(tmp_path / "x.keys")
    ring.ensure([ring.ref("a"), ring.ref("b")])
    stale = tmp_path / f"x.keys.tmp-{os.getpid()}"
    stale.write_text("left behind")
    os.chmod(stale, 0o644)
    assert ring.erase(ring.ref("a"))
    assert _mode(tmp_path / "x.keys") == 0o600 and not stale.exists()
