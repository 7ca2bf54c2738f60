"""The benchmark figures of the docs site are the recorded result files', rendered by scripts/bench_docs.py.

The numbers come from benchmark runs (benchmarks/bench_real_model.py --json writes
benchmarks/results/real_model.json; the other files there record the figures measured with the command
each names); nobody types them into docs/benchmarks.md. (The page was the README's benchmark section.)
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RESULT = RESULTS / "real_model.json"
PAGE = ROOT / "docs" / "benchmarks.md"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bench():
    return _load("bench_real_model", ROOT / "benchmarks" / "bench_real_model.py")


def _docs():
    return _load("bench_docs", ROOT / "scripts" / "bench_docs.py")


def test_benchmark_page_is_the_recorded_results():
    assert _docs().main(["--check"]) == 0


def test_real_model_table_is_the_recorded_result():
    if not RESULT.exists():
        pytest.skip(f"{RESULT} not recorded yet")
    # the benchmark's own --render --check agrees with the page bench_docs wrote
    assert _bench().render_readme(RESULT, check=True) == 0


def test_an_edited_number_is_caught(tmp_path):
    if not RESULT.exists():
        pytest.skip(f"{RESULT} not recorded yet")
    docs = _docs()
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    doc = json.loads(RESULT.read_text())
    rows = doc["rows"] if isinstance(doc, dict) else doc
    rows[0]["correct"] = rows[0]["correct"] + 1
    (results / "real_model.json").write_text(json.dumps(doc))
    current = json.loads((results / "current.json").read_text())
    current["rows"][0][1] = "0.1 / 0.2 ms (edited)"
    (results / "current.json").write_text(json.dumps(current))
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE.read_text())
    assert docs.main(["--check"], page=page, results=results) == 1
    assert docs.main([], page=page, results=results) == 0
    assert docs.main(["--check"], page=page, results=results) == 0
    text = page.read_text()
    assert "0.1 / 0.2 ms (edited)" in text and f"| {rows[0]['correct']}/{rows[0]['cases']} = " in text
    # and the benchmark's own renderer agrees with what bench_docs wrote
    assert _bench().render_readme(results / "real_model.json", check=True, readme=page) == 0


def test_a_results_file_without_its_block_is_refused(tmp_path):
    docs = _docs()
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    (results / "new_figure.json").write_text(json.dumps({"title": "t", "columns": ["a"], "rows": [["1"]],
                                                         "measured": {"commit": "abc1234", "date": "2026-12-07"}}))
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE.read_text())
    with pytest.raises(SystemExit, match="new-figure"):
        docs.main(["--check"], page=page, results=results)


def test_a_results_file_says_where_it_was_measured(tmp_path):
    docs = _docs()
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    doc = json.loads((results / "sealing.json").read_text())
    del doc["measured"]
    (results / "sealing.json").write_text(json.dumps(doc))
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE.read_text())
    with pytest.raises(SystemExit, match="sealing.json: no \"measured\""):
        docs.main(["--check"], page=page, results=results)


def test_every_block_shows_its_commit_and_date():
    """Each results file's block, on every page that shows it, names the commit and the date it was
    measured at; the commit is one of this repository's (where the checkout has its history)."""
    import subprocess

    docs = _docs()
    rendered = docs.blocks()
    for name, block in rendered.items():
        doc = json.loads((RESULTS / f"{name.replace('-', '_')}.json").read_text())
        m = doc["measured"]
        assert f"Measured on {m['date']} at commit `{m['commit']}`" in block, name
        git = subprocess.run(["git", "cat-file", "-e", f"{m['commit']}^{{commit}}"], cwd=ROOT,
                             capture_output=True)
        if (ROOT / ".git").exists() and git.returncode != 0:
            shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                                     capture_output=True, text=True).stdout.strip()
            assert shallow == "true", f"{name}: measured at {m['commit']}, which is not a commit here"
    shown = {p.name: docs._BLOCK.findall(p.read_text()) for p in docs.pages()}
    assert set(shown["benchmarks.md"]) == set(rendered)
    assert "kernel-vectors" in shown["portable-record.md"] and "policies-overhead" in shown["policies.md"]


def test_chest_slice_keeps_every_question_of_the_first_cases(tmp_path):
    bench = _bench()
    if not bench.SHARED_CHEST.exists():
        pytest.skip(f"shared benchmark data absent: {bench.SHARED_CHEST}")
    out = bench.chest_slice(bench.SHARED_CHEST, 2, tmp_path)
    ids = [json.loads(line)["case_id"] for line in out.read_text().splitlines()]
    groups = [i.rsplit("-q", 1)[0] for i in ids]
    assert sorted(set(groups)) == sorted({"cab-11583", "cab-13388"})
    assert ids == ["cab-11583-q1", "cab-11583-q2", "cab-11583-q3", "cab-11583-q4", "cab-11583-q5",
                   "cab-13388-q1", "cab-13388-q2", "cab-13388-q3"]
    assert all("case_descriptor" not in line for line in out.read_text().splitlines())
