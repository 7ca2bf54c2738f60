"""No SELSM state is embedded past the embedder's window on the official MedAgentBench tasks (issue 44).

The preset's run of every task the local sandbox grades (sim backbone), every state text handed to the
embedder counted in all-MiniLM-L6-v2's wordpieces, by benchmarks/bench_selsm_states.py's own code; the
whole-state ablation, as runs before issue 44 embedded, goes past it. Skips without the shared data.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_selsm_states", ROOT / "benchmarks" / "bench_selsm_states.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_state_is_embedded_past_the_window_on_the_official_tasks(tmp_path):
    bench = _bench()
    missing = [p for p in (bench.TASKS, bench.FUNCS, bench.PATIENTS) if not p.exists()]
    if missing:
        pytest.skip(f"shared MedAgentBench data absent: {', '.join(map(str, missing))}")
    out, texts = bench.run([], tmp_path, None)
    preset = bench.summary(texts)
    assert out["cases"] == 120 and preset["distinct"] > 40, (out["cases"], preset)
    assert preset["over"] == 0 and preset["max"] <= preset["budget"] == 254, preset
    out, texts = bench.run(["--ablation", "whole-state"], tmp_path, 30)  # before: most went past it
    whole = bench.summary(texts)
    assert whole["over"] > whole["distinct"] // 2, whole
