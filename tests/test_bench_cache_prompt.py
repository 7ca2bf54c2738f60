"""`benchmarks/bench_cache_prompt.py`: cache off then on, side by side, on the official MedAgentBench protocol.

The real measurement starts the local model twice (README, "Evaluate with a local model"); here the
server factory is the tests' fake OpenAI server (it has no prompt cache: both modes get the same replies),
so the slice, the alternation, the per-mode rows, the ratio and the same-replies check run in CI.
No timing is asserted.
"""

from __future__ import annotations

import contextlib
import json
import sys

import pytest

from conftest import ROOT, needs_medagentbench
from test_bench_local_model import BenchFake

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_cache_prompt  # noqa: E402

pytestmark = [needs_medagentbench, pytest.mark.slow]


def test_off_and_on_alternate_on_the_same_slice_and_are_compared(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "local")
    started: list[bool] = []

    @contextlib.contextmanager
    def fake_server(cache_prompt, threads):
        started.append(cache_prompt)
        with BenchFake() as server:
            yield server.base_url, "fake-model"

    out = tmp_path / "runs"
    assert bench_cache_prompt.main(["--types", "1", "--per-type", "1", "--reps", "2", "--out", str(out),
                                    "--json", str(tmp_path / "cache.json")], server=fake_server) == 0
    assert started == [False, True, False, True]  # off, on, off, on: alternating
    doc = json.loads((tmp_path / "cache.json").read_text())
    assert [(r["mode"], r["rep"]) for r in doc["rows"]] == [("off", 0), ("on", 0), ("off", 1), ("on", 1)]
    assert all(r["tasks"] == 1 and r["verified"] is True for r in doc["rows"])
    assert doc["same_replies"] and doc["all_verified"]  # one fake, one slice: the same recorded replies
    off = [r["s_per_task"] for r in doc["rows"] if r["mode"] == "off"]
    on = [r["s_per_task"] for r in doc["rows"] if r["mode"] == "on"]
    assert doc["speedup"] == round((sum(off) / 2) / (sum(on) / 2), 2)  # the ratio of the two modes' means
    assert sorted(p.name for p in out.glob("*.duckdb")) == ["off-0.duckdb", "off-1.duckdb", "on-0.duckdb", "on-1.duckdb"]
    assert "cache on:" in capsys.readouterr().out


def test_bad_counts_exit_2():
    with pytest.raises(SystemExit) as exc:
        bench_cache_prompt.main(["--reps", "0"])
    assert exc.value.code == 2
