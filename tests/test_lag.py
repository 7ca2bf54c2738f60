"""`--lag k` (issue 17 item 7, DESIGN §3): case i acts on the memory as of case i-1-k, the bytes
depend on k and never on timing, and with a live model up to k+1 cases wait on it at once.

- the pinning itself: every case's `memory.retrieved.memory_seq` is the seq of `case.completed` of
  case i-1-k (k = 0: the case before), and its learning stages still run in case order;
- determinism: the same k in another process, after a SIGKILL and a resume, with replies arriving
  in shuffled order, and with or without the ahead pass, gives the same fingerprint;
- pipelining: against a slow fake server the ahead pass keeps several requests in flight and the
  in-order pass is served from its replies (no request is sent twice).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES, MAB_TASKS, ROOT, needs_medagentbench
from fake_openai_server import FakeOpenAI
from fhir_helpers import FhirFake, run_fhir
from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.runs import RunSpec, open_run
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.eventstore import EventStore
from grandrounds.streams import lag as lag_module
from grandrounds.streams.embedded import EmbeddedRunner, GroupCommit
from llm_helpers import SECRET, HashEmbedder, live_options, openai_spec, run


@pytest.fixture(scope="module")
def cases():
    return load_cases(EXAMPLES)[0][:16]


def _sim(lag: int) -> RunSpec:
    return RunSpec(policy=EvoMedAgentPolicy(), seed=0, lag=lag)


def _run_sim(store: EventStore, cases, lag: int, commit: str = "group") -> None:
    cache = EmbeddingCache(HashEmbedder(), store.conn)
    ctx, _ = open_run(store, "r", _sim(lag), cache, cases=len(cases))
    asyncio.run(EmbeddedRunner(ctx, commit=commit).run(cases))
    cache.flush()


def _pins(store: EventStore) -> tuple[list[int], dict[int, int]]:
    events = list(store.iter("r"))
    read = [e.decode().memory_seq for e in events if e.type == "memory.retrieved"]
    done = {e.decode().index: e.seq for e in events if e.type == "case.completed"}
    return read, done


@pytest.mark.parametrize("lag", [0, 1, 3])
def test_case_i_reads_the_memory_as_of_case_i_minus_1_minus_k(cases, lag):
    with EventStore(":memory:") as s:
        _run_sim(s, cases, lag)
        read, done = _pins(s)
        before_first = min(e.seq for e in s.iter("r", types=["case.received"])) - 1
        assert read == [done[i - 1 - lag] if i - 1 - lag >= 0 else before_first for i in range(len(cases))]
        assert s.read("r", upto_seq=0)[0].decode().lag == lag  # recorded in run.started
        # the events of each case are contiguous and in case order, as without lag
        order = [e.case_id for e in s.iter("r") if e.case_id]
        assert order == sorted(order, key=[c.case_id for c in cases].index)
        assert s.verify_chain("r") is None


def test_lag_is_visible_in_memory_so_the_events_depend_on_k(cases):
    shown = {}
    for lag in (0, 1, 3):
        with EventStore(":memory:") as s:
            _run_sim(s, cases, lag)
            # what the agents were shown (not run.started, which names k anyway)
            shown[lag] = [e.payload for e in s.iter("r", types=["memory.retrieved"])]
    assert shown[0] != shown[1] != shown[3] != shown[0]


def test_commit_modes_and_a_resume_give_the_same_bytes_for_the_same_k(cases):
    with EventStore(":memory:") as ref:
        _run_sim(ref, cases, 2, commit="stage")
        want = ref.fingerprint("r")
    with EventStore(":memory:") as s:
        _run_sim(s, cases, 2, commit="group")
        assert s.fingerprint("r") == want
    with EventStore(":memory:") as s:  # stop after 7 cases (the log ends there), resume with the same command
        cache = EmbeddingCache(HashEmbedder(), s.conn)
        ctx, _ = open_run(s, "r", _sim(2), cache, cases=len(cases))

        def stop(index, ok):
            if index == 6:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            asyncio.run(EmbeddedRunner(ctx, commit="case").run(cases, on_case=stop))
        assert s.conn.execute("SELECT count(*) FROM events WHERE type = 'case.completed'").fetchone()[0] == 7
        ctx, _ = open_run(s, "r", _sim(2), cache, cases=len(cases))
        assert asyncio.run(EmbeddedRunner(ctx).run(cases)) == len(cases) - 7
        assert s.fingerprint("r") == want


KILLED_RUN = textwrap.dedent("""
    import asyncio, os, signal, sys
    sys.path.insert(0, "tests")
    from llm_helpers import HashEmbedder
    from grandrounds.handlers.cases import load_cases
    from grandrounds.handlers.policies.config import EvoMedAgentPolicy
    from grandrounds.handlers.runs import RunSpec, open_run
    from grandrounds.store.embeddings import EmbeddingCache
    from grandrounds.store.eventstore import EventStore
    from grandrounds.streams.embedded import EmbeddedRunner, GroupCommit

    db, examples, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cases = load_cases(examples)[0][:16]
    store = EventStore(db)
    ctx, _ = open_run(store, "r", RunSpec(policy=EvoMedAgentPolicy(), seed=0, lag=2),
                      EmbeddingCache(HashEmbedder(), store.conn), cases=len(cases))

    def on_case(index, ok):
        if kill_after and index + 1 == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)  # no flush, no close: a crash

    asyncio.run(EmbeddedRunner(ctx, group=GroupCommit(cases=4, ms=float("inf"))).run(cases, on_case=on_case))
    print(store.fingerprint("r"))
""")


def test_another_process_and_a_sigkill_then_resume_give_the_same_fingerprint(cases, tmp_path):
    with EventStore(":memory:") as s:
        _run_sim(s, cases, 2)
        want = s.fingerprint("r")
    clean = subprocess.run([sys.executable, "-c", KILLED_RUN, str(tmp_path / "clean.duckdb"), str(EXAMPLES), "0"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr[-2000:]
    assert clean.stdout.strip() == want  # another process, same k: same bytes
    db = tmp_path / "killed.duckdb"
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, str(db), str(EXAMPLES), "10"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    with EventStore(db) as s:
        assert s.conn.execute("SELECT count(*) FROM events WHERE type = 'case.completed'").fetchone()[0] == 8
        cache = EmbeddingCache(HashEmbedder(), s.conn)
        ctx, _ = open_run(s, "r", _sim(2), cache, cases=len(cases))  # pins cases 8-10 from the log
        assert asyncio.run(EmbeddedRunner(ctx).run(cases)) == 8
        assert s.fingerprint("r") == want
        assert s.verify_chain("r") is None


def _lagged_openai(lag: int) -> RunSpec:
    return openai_spec().model_copy(update={"lag": lag})


def _run_live(cases, lag: int, **server) -> tuple[str, dict, FakeOpenAI]:
    with FakeOpenAI(**server) as fake, EventStore(":memory:") as store:
        run(store, cases, _lagged_openai(lag), "r", live_options(fake))
        served = {}
        for e in store.iter("r", types=["llm.exchange"]):
            served[e.meta["served"]] = served.get(e.meta["served"], 0) + 1
        return store.fingerprint("r"), served, fake


def test_shuffled_replies_and_the_ahead_pass_never_change_the_bytes(cases, monkeypatch, caplog):
    few = cases[:8]
    caplog.set_level("WARNING", logger="grandrounds.lag")
    fp, served, fake = _run_live(few, 3, delay_s=0.02, jitter_s=0.05)
    assert served.get("prefetched", 0) > 0  # the in-order pass was served what the ahead pass fetched
    assert fake.max_in_flight >= 2  # several cases waited on the model at once
    n_exchanges = sum(served.values())
    assert len(fake.requests) == n_exchanges  # nothing was asked twice
    assert not [r for r in caplog.records if r.name == "grandrounds.lag"]  # every case ran ahead
    again, _, _ = _run_live(few, 3, delay_s=0.0, jitter_s=0.05)  # other timings, other arrival order
    assert again == fp
    monkeypatch.setattr(lag_module, "_wire_prefetch", lambda backbone: (None, None))
    no_ahead, served_live, fake = _run_live(few, 3)  # pinning only, every call in order
    assert no_ahead == fp and "prefetched" not in served_live and fake.max_in_flight == 1


class _DiesAfter(FakeOpenAI):
    def __init__(self, replies: int):
        super().__init__()
        self.left = replies

    def answer(self, path, body, auth):
        with self._lock:
            self.left -= 1
            dead = self.left < 0
        if dead:
            return 500, {"error": {"message": "boom", "type": "server_error"}}, {}
        return super().answer(path, body, auth)


def test_a_model_outage_with_cases_in_flight_resumes_to_the_same_bytes(cases, tmp_path):
    few = cases[:6]
    want, _, _ = _run_live(few, 2)
    from grandrounds.handlers.llm.errors import ModelOutage
    from grandrounds.handlers.llm.gateway import RetryPolicy

    with EventStore(tmp_path / "o.duckdb") as store:
        with _DiesAfter(9) as fake:  # the server fails for good after 9 replies: cases in flight hit it too
            with pytest.raises(ModelOutage):
                run(store, few, _lagged_openai(2), "r", live_options(fake, retry=RetryPolicy(max_attempts=2,
                                                                                              backoff_s=0.0)))
        with FakeOpenAI() as fake:
            run(store, few, _lagged_openai(2), "r", live_options(fake))
        assert store.fingerprint("r") == want


def test_a_lagged_run_goes_to_kafka(tmp_path, cases):
    """The Kafka worker pins memory as the embedded runner does (tests/test_kafka_replay.py and
    test_kafka_worker.py check the fingerprints on a real broker): `run --broker` and the producer take a
    lagged run; with no broker there, that is an outage (exit 1), not bad input."""
    from aiokafka.errors import KafkaConnectionError

    from grandrounds.streams.producer import submit_run

    out = CliRunner().invoke(main, ["run", str(EXAMPLES), "--db", str(tmp_path / "k.duckdb"), "--lag", "2",
                                    "--broker", "kafka://127.0.0.1:9", "--json"])
    assert out.exit_code == 1 and "Kafka at 127.0.0.1:9" in out.output, out.output
    with pytest.raises(KafkaConnectionError):
        asyncio.run(submit_run("127.0.0.1:9", "r", _sim(1), cases))


@pytest.mark.slow
@needs_medagentbench
def test_medagentbench_tasks_run_ahead_through_the_sandbox_to_the_same_bytes(tmp_path, monkeypatch, caplog):
    """FHIR tasks (the case the issue is about: rounds of ~48 s on the local model): the ahead pass acts
    through its own FHIR tools (GETs only; POSTs are never sent), and tasks 2 and 3 of a lag-2 run are
    shown no memory, since the first task's rule is learnt after they were pinned."""
    caplog.set_level("WARNING", logger="grandrounds.lag")
    env = {"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": ""}
    args = ("--protocol", "react", "--backbone", "openai", "--model", "fake-fhir", "--task-type", "1",
            "--limit", "5", "--lag", "2", "--run-id", "lagged")
    with FhirFake(delay_s=0.01, jitter_s=0.03) as server:
        code, out = run_fhir(MAB_TASKS, tmp_path / "a.duckdb", *args, "--base-url", server.base_url, env=env)
        assert code == 0, out
        acts = [r["messages"][1]["content"] for r in server.requests
                if r["messages"][0]["content"].startswith("You are an expert") and len(r["messages"]) == 2]
        asked = [r for r in server.requests  # the run's one json_schema probe is not a case's call
                 if (r.get("response_format") or {}).get("json_schema", {}).get("name") != "Probe"]
        assert len(asked) == out["llm"]["calls"]  # nothing asked twice
    assert out["correct"] == 5 and not [r for r in caplog.records if r.name == "grandrounds.lag"]
    assert ["## Memory" in a for a in acts] == [False, False, False, True, True]
    with EventStore(str(tmp_path / "a.duckdb"), read_only=True) as s:
        assert "prefetched" in {e.meta["served"] for e in s.iter("lagged", types=["llm.exchange"])}
    monkeypatch.setattr(lag_module, "_wire_prefetch", lambda backbone: (None, None))
    with FhirFake() as server:
        code, again = run_fhir(MAB_TASKS, tmp_path / "b.duckdb", *args, "--base-url", server.base_url, env=env)
    assert code == 0 and again["fingerprint"] == out["fingerprint"]
