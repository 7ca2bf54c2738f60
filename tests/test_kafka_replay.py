"""`grandrounds replay --broker kafka://…`: permutations run by two `grandrounds worker` processes on a real
broker give the local replay's runs, fingerprints, table, plot and report; a dead letter, a timeout, an
unreachable broker and a plan the workers cannot run each end with a clear error and exit code."""

from __future__ import annotations

import json
import re
import time

import pytest

from conftest import copy_db
from kafka_fixtures import (grandrounds, kafka_broker, kafka_warm, spawn_worker, stop_worker,  # noqa: F401
                            unique_prefix)
from grandrounds.streams.topics import partition_for

SOURCE = "reference-lag0"  # the embedded run of kafka_warm's 40 cases (in its warm file)
PERMS = 4
"""perm0..3 of SOURCE with seed 0 land on partitions 7, 1, 4, 4: odd and even, so both workers take runs."""

TIMING = {"seconds", "cases_per_second", "workers", "broker", "topic_prefix", "notes", "db", "plot", "report"}


def _replay(db, *extra, timeout=300):
    return grandrounds("replay", "--db", str(db), "--from", SOURCE, "--permutations", str(PERMS), "--json", *extra,
                       timeout=timeout)


def _client(warm, tmp_path, name: str):
    """A copy of the warm file with its key file: the source run's case content is sealed (its log is read)."""
    return copy_db(warm.db, tmp_path / f"{name}.duckdb")


def _comparable(out: dict) -> dict:
    """A replay's result without what depends on where and how fast it ran."""
    res = {k: v for k, v in out.items() if k not in TIMING}
    res["runs"] = [{k: v for k, v in r.items() if k not in ("seconds", "reused")} for r in out["runs"]]
    return res


def _retrieve_partitions(log_text: str) -> list[int] | None:
    found = re.findall(r"assigned retrieve partitions \[([0-9, ]*)\]", log_text)
    return [int(p) for p in found[-1].split(",") if p.strip()] if found else None


def _wait_for_split(logs, timeout=300.0) -> None:
    """Until the two workers own the 8 retrieve partitions half each (the co-partitioning assignor). Each
    loads MiniLM first: on a busy 2-core machine that alone took over 90 s."""
    deadline = time.monotonic() + timeout
    while True:
        owned = [_retrieve_partitions(p.read_text(errors="replace")) if p.exists() else None for p in logs]
        if all(o is not None and len(o) == 4 for o in owned) and sorted(owned[0] + owned[1]) == list(range(8)):
            return
        assert time.monotonic() < deadline, f"workers never split the partitions: {owned}"
        time.sleep(0.3)


def _worker_summary(log_path) -> dict:
    """The JSON line a `grandrounds worker --json` prints when it stops."""
    for line in reversed(log_path.read_text(errors="replace").splitlines()):
        if line.startswith("{") and '"cases_completed"' in line:
            return json.loads(line)
    raise AssertionError(f"no worker summary in {log_path}:\n{log_path.read_text()[-3000:]}")


@pytest.mark.kafka
def test_replay_over_kafka_with_two_workers_equals_local_replay(kafka_broker, kafka_warm, tmp_path):
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    url = f"kafka://{boot}"
    assert {partition_for(f"{SOURCE}-perm{k}-s0", 8) % 2 for k in range(PERMS)} == {0, 1}

    local = _client(kafka_warm, tmp_path, "local")
    ref = _replay(local, "--plot", str(tmp_path / "local.png"))
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = json.loads(ref.stdout)

    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    workers = [spawn_worker(boot, kafka_warm.worker_db(tmp_path, f"worker-{n}"), prefix, log, name=f"w{n}",
                            extra=("--json",))
               for n, log in zip("ab", logs)]
    try:
        _wait_for_split(logs)
        client = _client(kafka_warm, tmp_path, "client")
        t0 = time.monotonic()
        res = _replay(client, "--broker", url, "--topic-prefix", prefix, "--kafka-timeout", "240",
                      "--plot", str(tmp_path / "kafka.png"), "--report", str(tmp_path / "kafka.html"))
        print(f"\nreplay of {PERMS} x {len(kafka_warm.cases)} cases over Kafka (2 workers): "
              f"{time.monotonic() - t0:.1f}s")
        assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
        got = json.loads(res.stdout)
        assert _comparable(got) == _comparable(want)  # same run ids, orders, accuracies, fingerprints, curves
        assert [r["fingerprint"] for r in got["runs"]] == [r["fingerprint"] for r in want["runs"]]
        assert len({r["fingerprint"] for r in got["runs"]}) == PERMS
        assert got["broker"] == url and got["cases_executed"] == PERMS * len(kafka_warm.cases)
        assert (tmp_path / "kafka.png").stat().st_size > 0 and "<html" in (tmp_path / "kafka.html").read_text()

        # The human table names the same runs and fingerprints; asked again, every run is reused from --db.
        again = grandrounds("replay", "--db", str(client), "--from", SOURCE, "--permutations", str(PERMS),
                            "--broker", url, "--topic-prefix", prefix, "--kafka-timeout", "60", timeout=120)
        assert again.returncode == 0, again.stderr[-3000:]
        for r in want["runs"]:
            assert re.search(rf"{re.escape(r['run_id'])}\s.*{r['fingerprint'][:16]}….*already in db", again.stdout)
        assert "Kafka workers at " + url in again.stdout

        # perm4's id is taken on the worker by a run of another configuration (seed 3): the worker refuses
        # to open it (a dead letter), or that other run finishes first and its run.started, once copied,
        # does not match the plan; either way bad input, exit 2, naming the run and the field.
        taken = f"{SOURCE}-perm4-s0"
        sub = grandrounds("submit", str(kafka_warm.cases_file), "--broker", url, "--topic-prefix", prefix,
                          "--run-id", taken, "--seed", "3", "--sim-tool", "ddx-lookup=0.85", "--json")
        assert sub.returncode == 0, sub.stderr
        fresh = _client(kafka_warm, tmp_path, "fresh-client")
        bad = grandrounds("replay", "--db", str(fresh), "--from", SOURCE, "--permutations", str(PERMS + 1),
                          "--broker", url, "--topic-prefix", prefix, "--kafka-timeout", "240", "--json", timeout=300)
        assert bad.returncode == 2, (bad.stdout[-2000:], bad.stderr[-3000:])
        err = json.loads(bad.stdout)["error"]
        assert taken in err and "rejected" in err and "seed" in err, err
    finally:
        codes = [stop_worker(w) for w in workers]
    assert codes == [0, 0], [log.read_text()[-3000:] for log in logs]
    done = [_worker_summary(log)["cases_completed"] for log in logs]
    # Both workers ran permutations (the runs' partitions are split between them); the rejected run
    # took no case, the submitted seed-3 run took 40.
    assert all(n > 0 for n in done) and sum(done) == (PERMS + 1) * len(kafka_warm.cases), done


@pytest.mark.kafka
def test_replay_over_kafka_times_out_without_workers(kafka_broker, kafka_warm, tmp_path):
    """No worker on these topics: after --kafka-timeout the replay exits 1 naming the unfinished runs."""
    res = _replay(_client(kafka_warm, tmp_path, "client"), "--broker", f"kafka://{kafka_broker.bootstrap}",
                  "--topic-prefix", unique_prefix(), "--kafka-timeout", "3", timeout=120)
    assert res.returncode == 1, (res.stdout[-2000:], res.stderr[-3000:])
    err = json.loads(res.stdout)["error"]
    assert f"{PERMS} of {PERMS} run(s) not complete after 3s" in err and f"{SOURCE}-perm0-s0 0/40" in err, err


def test_replay_over_an_unreachable_broker_exits_1(kafka_warm, tmp_path):
    res = _replay(_client(kafka_warm, tmp_path, "client"), "--broker", "kafka://127.0.0.1:1", timeout=120)
    assert res.returncode == 1, (res.stdout[-2000:], res.stderr[-3000:])
    assert "Kafka at 127.0.0.1:1" in json.loads(res.stdout)["error"]


def test_replay_over_kafka_refuses_what_workers_cannot_run(kafka_warm, tmp_path):
    """An offline-mode source (its runs start from another run's memory; the worker starts runs empty)
    and a bad URL are bad input, before any connection."""
    db = _client(kafka_warm, tmp_path, "frozen")
    made = grandrounds("run", str(kafka_warm.cases_file), "--db", str(db), "--run-id", "frozen",
                       "--memory-from", SOURCE, "--sim-tool", "ddx-lookup=0.85", "--json")
    assert made.returncode == 0, made.stderr[-3000:]
    res = grandrounds("replay", "--db", str(db), "--from", "frozen", "--broker", "kafka://127.0.0.1:1", "--json")
    assert res.returncode == 2, (res.stdout[-2000:], res.stderr[-3000:])
    assert "offline mode" in json.loads(res.stdout)["error"]
    url = grandrounds("replay", "--db", str(db), "--from", SOURCE, "--broker", "127.0.0.1:9092", "--json")
    assert url.returncode == 2 and "kafka://" in json.loads(url.stdout)["error"]


@pytest.mark.kafka
def test_replay_of_a_lagged_run_over_kafka_equals_local(kafka_broker, kafka_warm, tmp_path):
    """A lag-2 source: its permutations are lag-2 runs; the worker pins memory as the embedded runner
    does, so the fingerprints are the local replay's."""
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    args = ("replay", "--from", "reference-lag2", "--permutations", "2", "--json")
    local = grandrounds(*args, "--db", str(_client(kafka_warm, tmp_path, "local")), timeout=300)
    assert local.returncode == 0, local.stderr[-3000:]
    log = tmp_path / "worker.log"
    worker = spawn_worker(boot, kafka_warm.worker_db(tmp_path), prefix, log)
    try:
        res = grandrounds(*args, "--db", str(_client(kafka_warm, tmp_path, "client")), "--broker", f"kafka://{boot}",
                          "--topic-prefix", prefix, "--kafka-timeout", "240", timeout=300)
    finally:
        assert stop_worker(worker) == 0, log.read_text()[-3000:]
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    want, got = json.loads(local.stdout), json.loads(res.stdout)
    assert _comparable(got) == _comparable(want)
    assert [r["run_id"] for r in got["runs"]] == ["reference-lag2-perm0-s0", "reference-lag2-perm1-s0"]
