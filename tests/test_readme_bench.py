"""The README's real-model benchmark table is the recorded result file's, rendered by the script.

The numbers come from a real model run (benchmarks/bench_real_model.py --json), committed as
benchmarks/results/real_model.json; nobody types them into the README.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "real_model.json"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_real_model", ROOT / "benchmarks" / "bench_real_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_table_is_the_recorded_result():
    if not RESULT.exists():
        pytest.skip(f"{RESULT} not recorded yet")
    assert _bench().render_readme(RESULT, check=True) == 0


def test_an_edited_number_is_caught(tmp_path):
    if not RESULT.exists():
        pytest.skip(f"{RESULT} not recorded yet")
    bench = _bench()
    doc = json.loads(RESULT.read_text())
    rows = doc["rows"] if isinstance(doc, dict) else doc
    rows[0]["correct"] = rows[0]["correct"] + 1
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    assert bench.render_readme(edited, check=True, readme=readme) == 1
    assert bench.render_readme(edited, check=False, readme=readme) == 0
    assert bench.render_readme(edited, check=True, readme=readme) == 0


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
