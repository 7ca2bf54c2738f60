"""`grandrounds run` with a model endpoint: backbone default, the record backend, exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from fake_openai_server import FakeOpenAI
from grandrounds.cli import main
from llm_helpers import SECRET


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "cases.jsonl"
    p.write_text("\n".join(EXAMPLES.read_text().splitlines()[:3]) + "\n")
    return p


def _invoke(args, env):
    res = CliRunner().invoke(main, ["run", *args, "--json"], env=env)
    return res.exit_code, json.loads(res.stdout.strip().splitlines()[-1])


def test_endpoint_selects_openai_and_record_replays_it(small, tmp_path):
    db = str(tmp_path / "g.duckdb")
    with FakeOpenAI() as server:
        code, live = _invoke([str(small), "--db", db, "--model", "m1", "--run-id", "live"],
                             {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": SECRET})
    assert code == 0, live
    assert live["backbone"] == "openai" and live["llm"]["calls"] >= 6
    assert any("using the openai backbone" in n for n in live["notes"])
    code, rec = _invoke([str(small), "--db", db, "--backbone", "record", "--record-from", "live"],
                        {"OPENAI_BASE_URL": "", "OPENAI_API_KEY": ""})
    assert code == 0, rec
    assert rec["run_id"] == "live-record" and rec["fingerprint"] == live["fingerprint"]
    assert any("record backend" in n for n in rec["notes"])
    assert SECRET not in open(db, "rb").read().decode("latin-1")

    lines = small.read_text().splitlines()
    case = json.loads(lines[1])
    case["question"] += " Also febrile."
    lines[1] = json.dumps(case)
    small.write_text("\n".join(lines) + "\n")
    code, err = _invoke([str(small), "--db", db, "--backbone", "record", "--record-from", "live", "--run-id", "d"],
                        {"OPENAI_BASE_URL": ""})
    assert code == 1 and f"case {case['case_id']}, stage act" in err["error"]


def test_without_an_endpoint_the_default_is_sim_and_says_so(small, tmp_path):
    code, out = _invoke([str(small), "--db", str(tmp_path / "s.duckdb")], {"OPENAI_BASE_URL": ""})
    assert code == 0 and out["backbone"] == "sim" and "llm" not in out
    assert any("no model endpoint configured" in n for n in out["notes"])


def test_bad_backbone_settings_exit_2(small, tmp_path):
    db = str(tmp_path / "b.duckdb")
    code, out = _invoke([str(small), "--db", db, "--backbone", "openai", "--base-url", "http://127.0.0.1:9/v1"], {})
    assert code == 2 and "--model" in out["error"]
    code, out = _invoke([str(small), "--db", db, "--backbone", "record"], {})
    assert code == 2 and "--record-from" in out["error"]
    code, out = _invoke([str(small), "--db", db, "--backbone", "record", "--record-from", "nope"], {})
    assert code == 2 and "no run 'nope'" in out["error"]
