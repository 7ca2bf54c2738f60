"""Files that cannot hurt: --db is a DuckDB file or nothing, export never destroys or half-writes,
and a command refused as bad input (exit 2) writes nothing at all."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.replay import export as export_module
from replay_fixtures import db_copy, recorded_db  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "cases.jsonl"


def _cases(tmp_path: Path, n: int = 2) -> Path:
    (tmp_path / "in").mkdir(exist_ok=True)
    path = tmp_path / "in" / "input.jsonl"
    path.write_text("".join(EXAMPLES.read_text().splitlines(keepends=True)[:n]))
    return path


def _invoke(*args):
    res = CliRunner().invoke(main, [*map(str, args), "--json"])
    return res, (json.loads(res.stdout) if res.stdout.strip() else None)


@pytest.mark.parametrize("name,content", [("cases.jsonl", '{"case_id": "x"}\n'), ("data.json", "{}"),
                                          ("table.csv", "a,b\n1,2\n"), ("notes.txt", "hello\n"),
                                          ("empty.duckdb", "")])
def test_db_that_is_not_a_duckdb_file_is_refused_and_left_alone(tmp_path, name, content):
    db = tmp_path / name
    db.write_text(content)
    res, out = _invoke("run", _cases(tmp_path), "--db", db)
    assert res.exit_code == 2 and name in out["error"] and "not a DuckDB" in out["error"], res.output
    assert db.read_text() == content
    for command in (["verify", "--db", db, "r"], ["replay", "--db", db, "--from", "r"],
                    ["audit", "items", "--db", db, "r"], ["export", "--db", db, "r", "--out", tmp_path / "o.jsonl"]):
        res, out = _invoke(*command)
        assert res.exit_code == 2 and name in out["error"], (command, res.output)
    assert db.read_text() == content and not (tmp_path / "o.jsonl").exists()


def test_db_that_is_a_directory_is_refused(tmp_path):
    res, out = _invoke("run", _cases(tmp_path), "--db", tmp_path)
    assert res.exit_code == 2 and "directory" in out["error"]


def test_a_db_path_with_a_colon_is_a_file_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("md:audit", ":memory:"):
        res, out = _invoke("run", _cases(tmp_path), "--db", name)
        assert res.exit_code == 0, res.output
        assert (tmp_path / name).is_file()  # persisted, not an extension's remote or a throwaway database
        assert duckdb.connect(str(tmp_path / name)).execute("SELECT count(*) FROM events").fetchone()[0] == out["events"]


def test_export_refuses_its_own_database_and_an_existing_file(db_copy, tmp_path):
    before = db_copy.read_bytes()
    res, out = _invoke("export", "--db", db_copy, "teach", "--out", db_copy, "--format", "parquet")
    assert res.exit_code == 2 and "database being exported" in out["error"]
    res, out = _invoke("export", "--db", db_copy, "teach", "--out", db_copy, "--format", "jsonl", "--force")
    assert res.exit_code == 2 and db_copy.read_bytes() == before
    target = tmp_path / "teach.jsonl"
    target.write_text("keep me\n")
    res, out = _invoke("export", "--db", db_copy, "teach", "--out", target)
    assert res.exit_code == 2 and "--force" in out["error"] and target.read_text() == "keep me\n"
    res, out = _invoke("export", "--db", db_copy, "teach", "--out", target, "--force")
    assert res.exit_code == 0 and len(target.read_text().splitlines()) == out["events"]


def test_an_interrupted_export_leaves_the_target_as_it_was(db_copy, tmp_path, monkeypatch):
    target = tmp_path / "teach.jsonl"
    real = export_module._write

    def dies_half_way(store, run_ids, path, fmt):
        real(store, run_ids, path, fmt)
        with path.open("a") as fh:
            fh.write('{"partial": ')
        raise KeyboardInterrupt  # what a kill looks like to the writer: the file is not finished

    monkeypatch.setattr(export_module, "_write", dies_half_way)
    res = CliRunner().invoke(main, ["export", "--db", str(db_copy), "teach", "--out", str(target), "--json"])
    assert res.exit_code != 0
    assert not target.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".teach")]


def test_a_missing_api_key_writes_nothing(tmp_path, monkeypatch, db_copy):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    db = tmp_path / "new.duckdb"
    res, out = _invoke("run", _cases(tmp_path), "--db", db, "--backbone", "openai", "--model", "m")
    assert res.exit_code == 2 and "OPENAI_API_KEY" in out["error"], res.output
    assert not db.exists() and not Path(f"{db}.wal").exists()
    # An existing file gets no run.started either.
    before = duckdb.connect(str(db_copy)).execute("SELECT count(*) FROM events").fetchone()[0]
    res, _ = _invoke("run", _cases(tmp_path), "--db", db_copy, "--backbone", "openai", "--model", "m")
    assert res.exit_code == 2
    assert duckdb.connect(str(db_copy)).execute("SELECT count(*) FROM events").fetchone()[0] == before


def test_memory_from_an_unknown_run_creates_no_file(tmp_path):
    db = tmp_path / "new.duckdb"
    res, out = _invoke("run", _cases(tmp_path), "--db", db, "--memory-from", "nosuchrun")
    assert res.exit_code == 2 and "nosuchrun" in out["error"]
    assert not db.exists()


def test_a_bad_case_file_creates_no_database(tmp_path):
    cases = tmp_path / "bad.jsonl"
    cases.write_text('{"case_id": "a", "kind": "mcq"}\n')
    db = tmp_path / "new.duckdb"
    res, out = _invoke("run", cases, "--db", db)
    assert res.exit_code == 2 and "bad.jsonl:1" in out["error"] and not db.exists()
