"""Group commit in the embedded runner: same bytes as any other mode, a crash loses only the
uncommitted cases, and the same command executes them again to the same fingerprint."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

from conftest import EXAMPLES, ROOT, run_in
from grandrounds.handlers.runs import open_run
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore
from grandrounds.streams.embedded import EmbeddedRunner, GroupCommit


def _completed_in_file(store: EventStore) -> int:
    return store.conn.execute("SELECT count(*) FROM events WHERE type = 'case.completed'").fetchone()[0]


def test_group_commit_writes_every_n_cases_and_the_same_bytes_as_per_stage(example_cases, evo_spec):
    cases = example_cases[:20]
    ref = EventStore(":memory:")
    run_in(ref, cases, evo_spec, commit="stage")

    s = EventStore(":memory:")
    ctx, _ = open_run(s, "r", evo_spec, EmbeddingCache(shared_minilm(), s.conn))
    runner = EmbeddedRunner(ctx, commit="group", group=GroupCommit(cases=6, ms=float("inf")))
    in_file: list[int] = []
    asyncio.run(runner.run(cases, on_case=lambda i, ok: in_file.append(_completed_in_file(s))))
    # after case i (0-based) the file holds the cases of the groups closed so far
    assert in_file == [6 * ((i + 1) // 6) for i in range(20)]
    assert _completed_in_file(s) == 20
    assert s.fingerprint("r") == ref.fingerprint("r")


def test_a_zero_ms_bound_commits_every_case(example_cases, evo_spec):
    s = EventStore(":memory:")
    ctx, _ = open_run(s, "r", evo_spec, EmbeddingCache(shared_minilm(), s.conn))
    runner = EmbeddedRunner(ctx, commit="group", group=GroupCommit(cases=1000, ms=0))
    in_file: list[int] = []
    asyncio.run(runner.run(example_cases[:5], on_case=lambda i, ok: in_file.append(_completed_in_file(s))))
    assert in_file == [1, 2, 3, 4, 5]


KILLED_RUN = textwrap.dedent("""
    import asyncio, os, signal, sys
    from grandrounds.handlers.cases import load_cases
    from grandrounds.handlers.policies.config import EvoMedAgentPolicy
    from grandrounds.handlers.runs import RunSpec, open_run
    from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
    from grandrounds.store.eventstore import EventStore
    from grandrounds.streams.embedded import EmbeddedRunner, GroupCommit

    db, examples, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cases = load_cases(examples)[0][:24]
    store = EventStore(db)
    cache = EmbeddingCache(shared_minilm(), store.conn)
    ctx, _ = open_run(store, "r", RunSpec(policy=EvoMedAgentPolicy(), seed=0), cache)

    def on_case(index, ok):
        if index + 1 == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)  # no flush, no close: a crash

    asyncio.run(EmbeddedRunner(ctx, group=GroupCommit(cases=5, ms=float("inf"))).run(cases, on_case=on_case))
""")


def test_sigkill_loses_only_uncommitted_cases_and_the_resume_gives_the_same_bytes(example_cases, evo_spec, tmp_path):
    cases = example_cases[:24]
    ref = EventStore(":memory:")
    run_in(ref, cases, evo_spec)

    db = tmp_path / "killed.duckdb"
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(db), str(EXAMPLES), "13"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    s = EventStore(db)
    assert _completed_in_file(s) == 10  # two groups of 5 committed; cases 11-13 were lost with the process
    last = s.conn.execute("SELECT type FROM events ORDER BY seq DESC LIMIT 1").fetchone()[0]
    assert last == "case.completed"  # the log ends at a case boundary
    ctx, _ = open_run(s, "r", evo_spec, EmbeddingCache(shared_minilm(), s.conn))
    assert asyncio.run(EmbeddedRunner(ctx).run(cases)) == 14
    assert s.fingerprint("r") == ref.fingerprint("r")
    assert s.verify_chain("r") is None
    s.close()
