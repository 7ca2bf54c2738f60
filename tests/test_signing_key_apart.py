"""A signing key lives apart from the data it vouches for (issue 43, part 4).

A head signed with a key kept beside the database is one anyone holding the folder can forge, and
`verify` would call it valid: `sign`, `run`, `replay`, `verify` and `worker` refuse, as bad input (exit 2,
nothing written), a `--key-file` that is the database, its WAL, its key file, any grandrounds key file,
or any file in the database's folder, and say where a signing key belongs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli_helpers import cli_json, example_cases
from grandrounds.store.signing import SigningKeyError, check_key_apart, load_key
from hostile_rows import Hostile

KEY = b"s" * 32
T = "tests/test_signing_key_apart.py::"
BESIDE = "the database, its key file, a file in its folder, or a symlink elsewhere to one"
HOSTILE = {  # the rows of docs/trust.md's hostile matrix these tests assert
    "sign": Hostile(f"`sign --key-file` {BESIDE}", T + "test_sign_and_verify_refuse_a_key_kept_with_the_database[sign]",
                    "signed, and the head verified as valid to anyone holding the folder",
                    exit=2, says=("keep the signing key in",), written=False),
    "verify": Hostile(f"`verify --key-file` {BESIDE}",
                      T + "test_sign_and_verify_refuse_a_key_kept_with_the_database[verify]",
                      "accepted: a head forged with it verified as valid", exit=2, says=("keep the signing key in",)),
    "run": Hostile("`run --key-file` a file in the new database's folder", T + "test_run_refuses_before_it_writes",
                   "accepted", exit=2, says=("database's folder",), written=False),
    "replay": Hostile("`replay --key-file` a file in the database's folder", T + "test_replay_refuses_too",
                      "accepted", exit=2, says=("keep the signing key in",)),
    "worker": Hostile("`worker --key-file` a file in the database's folder", T + "test_the_worker_refuses_too",
                      "accepted", exit=2, says=("keep the signing key in",), written=False),
}


@pytest.fixture(scope="module")
def run_db(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("apart")
    data = d / "data"
    data.mkdir()
    code, out = cli_json("run", example_cases(d, 3), "--db", data / "r.duckdb", "--run-id", "r")
    assert code == 0, out
    return data / "r.duckdb"


@pytest.fixture()
def outside(tmp_path) -> Path:
    folder = tmp_path / "keys"
    folder.mkdir()
    key = folder / "signing.key"
    key.write_bytes(KEY)
    return key


def _beside(db: Path) -> dict[str, Path]:
    """Each place a signing key must not be, for the database `db` (created as needed)."""
    beside = db.parent / "signing.key"
    beside.write_bytes(KEY)
    link = db.parent.parent / "link-to-beside.key"  # a symlink elsewhere to a file in the folder
    if not link.exists():
        link.symlink_to(beside)
    return {"the database": db, "its key file": Path(f"{db}.keys"), "a file beside it": beside,
            "a symlink to a file beside it": link}


@pytest.mark.parametrize("command", ["sign", "verify"])
def test_sign_and_verify_refuse_a_key_kept_with_the_database(run_db, command):
    row = HOSTILE[command]
    for what, key in _beside(run_db).items():
        before = run_db.read_bytes()
        code, out = cli_json(command, "--db", run_db, "r", "--key-file", key)
        assert code == row.exit, (what, out)
        assert row.said(out["error"]) and str(key) in out["error"], (what, out)
        assert run_db.read_bytes() == before, what  # nothing signed


def test_a_key_in_its_own_folder_signs_and_verifies(run_db, outside):
    code, out = cli_json("sign", "--db", run_db, "r", "--key-file", outside)
    assert code == 0, out
    code, out = cli_json("verify", "--db", run_db, "r", "--key-file", outside)
    assert code == 0 and out["signed_head"]["status"] == "valid", out


def test_run_refuses_before_it_writes(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    key = data / "signing.key"
    key.write_bytes(KEY)
    db = data / "new.duckdb"
    code, out = cli_json("run", example_cases(tmp_path, 2), "--db", db, "--key-file", key)
    row = HOSTILE["run"]
    assert code == row.exit and row.said(out["error"]), out
    assert row.written is False and not db.exists() and not Path(f"{db}.keys").exists()  # bad input


def test_replay_refuses_too(run_db):
    key = _beside(run_db)["a file beside it"]
    code, out = cli_json("replay", "--db", run_db, "--from", "r", "--permutations", "1", "--key-file", key)
    assert code == HOSTILE["replay"].exit and HOSTILE["replay"].said(out["error"]), out


def test_the_worker_refuses_too(tmp_path):
    """Refused before it joins a group: no broker is reached (none listens on port 9), no database created."""
    data = tmp_path / "data"
    data.mkdir()
    key = data / "signing.key"
    key.write_bytes(KEY)
    db, row = data / "w.duckdb", HOSTILE["worker"]
    code, out = cli_json("worker", "--broker", "kafka://127.0.0.1:9", "--db", db, "--key-file", key)
    assert code == row.exit and row.said(out["error"]), out
    assert row.written is False and not db.exists()


def test_the_check_itself(tmp_path):
    db = tmp_path / "d" / "x.duckdb"
    db.parent.mkdir()
    wal = Path(f"{db}.wal")
    for key in (db, wal, Path(f"{db}.keys")):
        with pytest.raises(SigningKeyError, match="is the database"):
            check_key_apart(key, db)
    with pytest.raises(SigningKeyError, match="database's folder"):
        check_key_apart(db.parent / "k.key", db)
    check_key_apart(tmp_path / "k.key", db)  # another folder: fine
    check_key_apart(db.parent / "k.key", None)  # no database named: nothing to keep it apart from
    (tmp_path / "k.key").write_bytes(KEY)
    assert load_key(str(tmp_path / "k.key"), db=db).secret == KEY
    assert load_key(None, environ={"GRANDROUNDS_SIGNING_KEY": KEY.decode()}, db=db).secret == KEY
    os.remove(tmp_path / "k.key")
