"""An auditor's copy that cannot be written (issue 32, item 4): `verify`, `audit`, `export` and `ui` open
the database read-only (re-execution goes into a scratch store), so a read-only or immutable copy
verifies and stays byte for byte what it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from cli_helpers import cli_json, example_cases


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ro-src")
    cases = example_cases(d, 3)
    db = d / "audit.duckdb"
    code, out = cli_json("run", cases, "--db", db, "--run-id", "r")
    assert code == 0, out
    return db


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _checks(db: Path, out_dir: Path) -> None:
    """What an auditor runs on the copy: every one succeeds."""
    code, out = cli_json("verify", "--db", db, "r")
    assert code == 0 and out["ok"] and out["identical"], out
    code, out = cli_json("audit", "items", "--db", db, "r")
    assert code == 0, out
    code, out = cli_json("audit", "explain", "--db", db, "r", "0")
    assert code == 0 and out.get("content_erased") is not True, out
    code, out = cli_json("export", "r", "--db", db, "--out", out_dir / "events.jsonl")
    assert code == 0 and out["events"] > 0, out
    from grandrounds.ui.app import create_app

    app = create_app(str(db))
    try:
        with TestClient(app) as client:
            assert client.get("/").status_code == 200
    finally:
        app.state.view.store.close()


def _copy_into(original: Path, folder: Path) -> Path:
    folder.mkdir()
    db = folder / original.name
    shutil.copy(original, db)
    shutil.copy(f"{original}.keys", f"{db}.keys")
    return db


def test_a_read_only_copy_verifies_and_is_left_as_it_was(original, tmp_path):
    folder = tmp_path / "ro"
    db = _copy_into(original, folder)
    for p in folder.iterdir():
        os.chmod(p, 0o444)
    os.chmod(folder, 0o555)
    before = _snapshot(folder)
    try:
        _checks(db, tmp_path)
        assert _snapshot(folder) == before  # no byte changed, no WAL or key file made beside it
    finally:
        os.chmod(folder, 0o755)


def _chattr(flag: str, *paths: Path) -> bool:
    try:
        return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def test_an_immutable_copy_verifies(original, tmp_path):
    """`chattr +i`: not even root can write the file or create one beside it (what a read-only bind
    mount or a WORM store gives an auditor). Skipped where chattr is not allowed (not root, tmpfs)."""
    folder = tmp_path / "immutable"
    db = _copy_into(original, folder)
    paths = [db, Path(f"{db}.keys"), folder]
    if not _chattr("+i", *paths):
        pytest.skip("chattr +i is not permitted here (needs root and a filesystem with the flag)")
    try:
        before = _snapshot(folder)
        with pytest.raises(PermissionError):
            (folder / "probe").write_text("x")  # the copy really is immutable
        _checks(db, tmp_path)
        assert _snapshot(folder) == before
    finally:
        _chattr("-i", *paths)
