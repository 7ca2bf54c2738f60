"""The replay report and plot: the memory-free baseline on the same orders, a bootstrap interval
for the mean, rolling-window accuracy beside the cumulative curve, case counts per category."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from grandrounds.app import run_cases
from grandrounds.cli import main
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.runs import RunSpec
from grandrounds.replay.stats import bootstrap_mean_ci
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore
from replay_fixtures import teaching_cases


@pytest.fixture(scope="module")
def teach_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "t.duckdb"
    with EventStore(path) as store:
        run_cases(store, teaching_cases(), RunSpec(policy=EvoMedAgentPolicy(), source="teaching"), run_id="teach",
                  cache=EmbeddingCache(shared_minilm(), store.conn))
    return path


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    accs = [0.70, 0.72, 0.75, 0.69, 0.71]
    a, b = bootstrap_mean_ci(accs, seed=0), bootstrap_mean_ci(accs, seed=0)
    assert a == b and a[0] <= sum(accs) / len(accs) <= a[1] and a[0] >= 0.69 and a[1] <= 0.75
    # the seed drives the resampling (visible with few resamples; 10,000 make the quantiles settle)
    assert bootstrap_mean_ci(accs, seed=0, resamples=200) != bootstrap_mean_ci(accs, seed=1, resamples=200)
    assert bootstrap_mean_ci([0.7], seed=0) is None
    assert bootstrap_mean_ci([0.5, 0.5, 0.5], seed=0) == (0.5, 0.5)


@pytest.mark.slow  # six 7-case runs and three replay commands: about a minute on 2 busy cores
def test_replay_with_the_baseline_on_the_same_orders(teach_db, tmp_path):
    plot, report = tmp_path / "c.png", tmp_path / "r.html"
    res = CliRunner().invoke(main, ["replay", "--db", str(teach_db), "--from", "teach", "--permutations", "3",
                                    "--seed", "0", "--baseline", "none", "--plot", str(plot), "--report",
                                    str(report), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    base = out["baseline"]
    assert base["policy"] == "none" and len(base["runs"]) == 3
    assert [r["order_seed"] for r in base["runs"]] == [r["order_seed"] for r in out["runs"]]  # same orders
    with EventStore(teach_db, read_only=True) as store:
        cases = [[e.case_id for e in store.read(r["run_id"], types=["case.received"])]
                 for r in out["runs"] + base["runs"]]
    assert cases[:3] == cases[3:]
    lo, hi = out["accuracy_ci95"]
    assert lo <= out["accuracy_mean"] <= hi
    assert out["rolling_window"] == 5 and all(len(r["rolling_accuracy"]) == 7 for r in out["runs"])
    assert len(out["mean_rolling"]) == 7
    html = report.read_text()
    assert "baseline, same orders" in html and "95% interval (bootstrap)" in html
    assert "(2/2)" in html or "(1/2)" in html or "(0/2)" in html  # cardiology: accuracy (correct/cases)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    human = CliRunner().invoke(main, ["replay", "--db", str(teach_db), "--from", "teach", "--permutations", "3",
                                      "--seed", "0", "--baseline", "none"])
    assert "baseline   policy none on the same orders" in human.output and "95% interval of the mean" in human.output
    again = json.loads(CliRunner().invoke(main, ["replay", "--db", str(teach_db), "--from", "teach",
                                                 "--permutations", "3", "--seed", "0", "--json"]).stdout)
    assert again["accuracy_ci95"] == out["accuracy_ci95"] and "baseline" not in again


def test_baseline_of_a_baseline_is_refused(teach_db):
    res = CliRunner().invoke(main, ["replay", "--db", str(teach_db), "--from", "teach", "--permutations", "2",
                                    "--policy", "none", "--baseline", "none"])
    assert res.exit_code == 2 and "already runs policy none" in res.output
