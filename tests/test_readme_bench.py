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
