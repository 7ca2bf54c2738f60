"""Input files (issue 32, item 5): a case line with a duplicate JSON key is refused (exit 2, file:line,
the key), because readers disagree on which value wins; a policy TOML that is not UTF-8, or is not a file,
fails naming the file; so does a signing key file that cannot be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.handlers.cases import CaseFileError, load_cases, open_cases
from grandrounds.handlers.policies.config import PolicyError, load_policy

GOOD = {"case_id": "a", "kind": "mcq", "question": "Which?", "options": {"A": "x", "B": "y"}, "answer": "A",
        "category": "c"}


def _line(**extra) -> str:
    return json.dumps(dict(GOOD, **extra))


# Python's json keeps the last value of a repeated key; jq, many JSON libraries and a first-wins reader
# keep another: the same line is two different cases.
DUPLICATES = [
    ('{"case_id": "a", ' + _line()[1:-1].replace('"case_id": "a", ', "") + ', "case_id": "b"}', "case_id"),
    (_line().replace('"options": {"A": "x", "B": "y"}', '"options": {"A": "x", "B": "y", "A": "z"}'), "A"),
    (_line().replace('"answer": "A"', '"answer": "A", "answer": "B"'), "answer"),
]


@pytest.mark.parametrize("line,key", DUPLICATES, ids=[k for _, k in DUPLICATES])
def test_a_duplicate_key_is_refused_with_file_and_line(tmp_path, line, key):
    path = tmp_path / "cases.jsonl"
    path.write_text(_line(case_id="first") + "\n" + line + "\n")
    assert json.loads(line)  # valid JSON all the same: only a duplicate-aware reader sees it
    for reader in (load_cases, open_cases):
        with pytest.raises(CaseFileError) as err:
            reader(path)
        assert err.value.line == 2 and err.value.field == key and f"{path}:2" in str(err.value)
        assert "duplicate key" in str(err.value)
    res = CliRunner().invoke(main, ["run", str(path), "--db", str(tmp_path / "x.duckdb"), "--json"])
    assert res.exit_code == 2 and f"{path}:2" in json.loads(res.stdout)["error"]
    assert not (tmp_path / "x.duckdb").exists()


def test_same_key_in_different_objects_is_fine(tmp_path):
    from grandrounds.handlers.cases import loads_unique

    assert loads_unique('{"a": {"a": 1, "b": {"a": 2}}, "b": [{"a": 3}, {"a": 4}]}')["b"][1] == {"a": 4}
    path = tmp_path / "cases.jsonl"
    path.write_text(_line() + "\n" + _line(case_id="b") + "\n")
    assert [c.case_id for c in load_cases(path)[0]] == ["a", "b"]


def test_a_policy_file_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_bytes(b'name = "none"\n# caf\xe9\n')
    with pytest.raises(PolicyError, match=rf"{path}:2: not UTF-8"):
        load_policy(str(path))
    cases = tmp_path / "cases.jsonl"
    cases.write_text(_line() + "\n")
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(tmp_path / "x.duckdb"), "--policy", str(path),
                                    "--json"])
    assert res.exit_code == 2 and str(path) in json.loads(res.stdout)["error"]
    folder = tmp_path / "policy_dir"
    folder.mkdir()
    with pytest.raises(PolicyError, match=rf"{folder}: is a directory"):
        load_policy(str(folder))


def test_a_signing_key_file_that_cannot_be_read_names_the_file(tmp_path):
    from grandrounds.store.signing import SigningKeyError, load_key

    with pytest.raises(SigningKeyError, match="no such file"):
        load_key(str(tmp_path / "nope.key"))
    (tmp_path / "dir.key").mkdir()
    with pytest.raises(SigningKeyError, match="dir.key"):
        load_key(str(tmp_path / "dir.key"))
