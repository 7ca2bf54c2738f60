"""`grandrounds worker --agent module:callable`: the user's own agent as the Kafka worker's act backbone.

What must hold: a worker started with `--agent` answers the runs submitted with `--backbone agent` through
that agent, recording its replies exactly as `grandrounds run --agent` does (the same cases and scripted
replies give the same fingerprint either way), so `grandrounds verify` of the worker's run re-executes it
from the record without the agent's module anywhere on the path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka_fixtures import ROOT, grandrounds, kafka_broker, kafka_warm, stop_worker, unique_prefix  # noqa: F401
from grandrounds.store.eventstore import EventStore

pytestmark = [pytest.mark.kafka]

N = 6
AGENT = "ward_agent"  # a module name nothing else in the repository has: importable only where the test puts it
NAME = "ward-agent"
RUN = "agent-run"


def _agent_dir(tmp_path: Path) -> Path:
    """A directory holding the scripted agent of the own-agent tests (its reply is a function of what it is
    shown) under a name of its own; the worker and `run --agent` import it from their working directory."""
    d = tmp_path / "agent"
    d.mkdir()
    shutil.copyfile(ROOT / "tests" / "own_agent_script.py", d / f"{AGENT}.py")
    return d


def _python(*args: str, cwd: Path, timeout: float = 180.0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


def _log(db: Path, run_id: str) -> tuple[list[tuple], str]:
    with EventStore(str(db), read_only=True) as store:
        return ([(e.seq, e.type, json.dumps(e.payload, sort_keys=True)) for e in store.read(run_id)],
                store.fingerprint(run_id))


def test_a_worker_with_agent_records_its_replies_and_verify_needs_no_agent(kafka_broker, kafka_warm, tmp_path):
    boot, prefix = kafka_broker.bootstrap, unique_prefix()
    url = f"kafka://{boot}"
    agent_dir = _agent_dir(tmp_path)
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(kafka_warm.cases_file.read_text(encoding="utf-8").splitlines()[:N]) + "\n",
                     encoding="utf-8")

    # The embedded reference: `run --agent` with the same agent, cases and name (a warm copy: nothing to embed).
    embedded = kafka_warm.worker_db(tmp_path, "embedded")
    keys = Path(f"{kafka_warm.db}.keys")
    if keys.exists():  # the reference runs' sealed content: the embedded run opens the file with its key file
        shutil.copyfile(keys, f"{embedded}.keys")
    ran = _python("-m", "grandrounds", "run", str(cases), "--db", str(embedded), "--agent", f"{AGENT}:agent",
                  "--model", NAME, "--run-id", RUN, "--json", cwd=agent_dir)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout)["backbone"] == "agent"

    log_path = tmp_path / "worker.log"
    with open(log_path, "ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "grandrounds", "worker", "--broker", url, "--db",
             str(kafka_warm.worker_db(tmp_path)), "--group", prefix + "g", "--topic-prefix", prefix,
             "--agent", f"{AGENT}:agent", "--model", NAME],
            cwd=agent_dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    client = tmp_path / "client.duckdb"
    try:
        sub = grandrounds("submit", str(cases), "--broker", url, "--run-id", RUN, "--backbone", "agent",
                          "--model", NAME, "--topic-prefix", prefix, "--json")
        assert sub.returncode == 0, sub.stderr[-3000:]
        deadline = time.monotonic() + 180
        while True:  # the changelog into a database of its own, until the run is complete there
            col = grandrounds("collect", "--broker", url, "--db", str(client), "--run-id", RUN, "--topic-prefix",
                              prefix, "--json")
            assert col.returncode == 0, col.stderr[-3000:]
            with EventStore(str(client), read_only=True) as store:
                if store.has_run(RUN) and any(True for _ in store.iter(RUN, types=["run.completed"])):
                    break
            assert worker.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(1)
    finally:
        assert stop_worker(worker) == 0, log_path.read_text()[-3000:]

    rows, fingerprint = _log(client, RUN)
    ref_rows, ref_fingerprint = _log(embedded, RUN)
    assert fingerprint == ref_fingerprint
    assert [r[1:] for r in rows if r[1] != "run.started"] == [r[1:] for r in ref_rows if r[1] != "run.started"]
    exchanges = [json.loads(p) for _, t, p in rows if t == "llm.exchange"]
    assert len(exchanges) == N and {x["model"] for x in exchanges} == {NAME}  # one recorded reply per case
    assert {x["stage"] for x in exchanges} == {"act"}

    # Elsewhere, the agent's module is not importable; verify re-executes the run from its record all the same.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _python("-c", f"import {AGENT}", cwd=elsewhere).returncode != 0
    verified = _python("-m", "grandrounds", "verify", "--db", str(client), RUN, "--json", cwd=elsewhere)
    out = json.loads(verified.stdout.strip().splitlines()[-1])
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    assert out["identical"] and out["ok"] and out["replayed_from_record"]
