"""benchmarks/bench_lag.py --base-url: the k sweep against a given endpoint, exercised against the fake.

The real measurement is against `grandrounds model serve --parallel N`; here the script is pointed at
tests/fake_openai_server.py (started by the test, passed by URL), so the path that starts no fake,
probes json_schema, runs the real-model benchmark's recurring stream and prints the table runs in CI.
No timing is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT
from fake_openai_server import FakeOpenAI


def test_endpoint_sweep_runs_the_recurring_stream_against_the_given_server():
    first = json.loads((ROOT / "examples" / "recurring_test.jsonl").read_text().splitlines()[0])
    with FakeOpenAI(delay_s=0.05) as server:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bench_lag.py"), "--base-url", server.base_url,
             "--model", "fake-model", "--cases", "3", "--lags", "0,1", "--rounds", "2", "--policy", "none",
             "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600,
            env=dict(os.environ, OPENAI_API_KEY="not-needed"))
        requests = list(server.requests)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["stream"] == "recurring_test.jsonl" and doc["cases"] == 3 and doc["rounds"] == 2
    assert doc["slots"] is None  # the fake has no llama.cpp /props
    assert doc["actions"]["mode"] == "schema"  # probed like `run --actions auto`: the fake enforces json_schema
    rows = {r["lag"]: r for r in doc["rows"]}
    assert sorted(rows) == [0, 1] and rows[0]["ratio"] == 1.0
    for r in rows.values():  # the fake answers the same request the same way: every k agrees across rounds
        assert r["rounds_agree"] and len(set(r["fingerprints"])) == 1 and len(r["correct"]) == 2
        assert r["exchanges"] >= 3 and r["s_per_case"] > 0
    assert rows[0]["prefetched"] == 0 and rows[1]["prefetched"] > 0
    assert rows[0]["fingerprints"][0] != rows[1]["fingerprints"][0]  # k is in the run: another run
    # the model was this server, asked about the real-model benchmark's cases (nothing started in the script)
    assert any(first["question"] in json.dumps(r) for r in requests)


def test_endpoint_needs_model_and_stays_embedded():
    for extra in (["--base-url", "http://127.0.0.1:9/v1"],
                  ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--kafka"]):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_lag.py"), *extra],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 2 and ("go together" in proc.stderr or "embedded only" in proc.stderr)
