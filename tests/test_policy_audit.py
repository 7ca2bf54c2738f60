"""`audit items` lists the memory of every policy, as of any point of the stream."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from tests.conftest import EXAMPLES


def _json(args: list[str]) -> dict:
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


@pytest.mark.parametrize("policy,kind,count_key", [
    ("skemex", "skill", None), ("selsm", "selsm-record", "selsm_records"), ("retrosum", "experience", "experiences")])
def test_audit_items_shows_each_policys_memory_over_time(tmp_path, policy, kind, count_key):
    db = str(tmp_path / "a.duckdb")
    run = _json(["run", str(EXAMPLES), "--db", db, "--run-id", "r", "--policy", policy])
    end = _json(["audit", "items", "--db", db, "r"])
    mine = [i for i in end["items"] if i["kind"] == kind]
    assert mine and all(i["kind"] in (kind, "tool") for i in end["items"])
    if count_key:
        assert len(mine) == run["memory"][count_key]
    else:  # skills: every non-archived skill is counted by status
        live = sum(v for k, v in run["memory"]["skills"].items())
        assert len(mine) == live
    early = _json(["audit", "items", "--db", db, "r", "--as-of-case", "10", "--kind", kind])
    assert len(early["items"]) < len(mine)  # time travel: fewer items earlier in the stream
    assert all(i.get("created_seq", 0) <= early["as_of"]["seq"] for i in early["items"])
