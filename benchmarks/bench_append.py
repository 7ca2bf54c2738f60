"""Batched appends: grandrounds' DuckDB EventStore against the `eventsourcing` library's SQLite recorder,
on the same events, side by side in one process (rounds alternate; ranges reported).

    pip install -e '.[bench]'        # eventsourcing is a benchmark-only extra
    python benchmarks/bench_append.py [--cases 400] [--rounds 3] [--group 64] [--json]

The events are those of a real sim run of the example cases (every stage's events: memory.retrieved,
answer.given, ..., case.completed), each case's batch kept together. Both stores write files in a temp
folder (removed at exit) and commit:
  per case   one transaction per case (what `--commit case` does),
  per group  one transaction per --group cases (what `--commit group`, the default, does).
A third line times DuckDB's part alone: the same rows' stored texts inserted and committed the same way
(what is left of grandrounds' figure once serialising, hashing and sealing are taken out).
grandrounds' figure includes everything `EventStore.append` does per event (canonical JSON, the hash
chain, the multi-row INSERT); eventsourcing's gets the payload as ready-made bytes (its recorder
does no serialisation: that is its mapper's job, not timed here), so the comparison favours it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_dir, repeated_cases  # noqa: E402

from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.config import EvoMedAgentPolicy  # noqa: E402
from grandrounds.handlers.runs import RunSpec  # noqa: E402
from grandrounds.store.events import NewEvent  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402


def case_batches(n_cases: int) -> list[list]:
    """The stored events of a sim run over n cases, grouped by case (the run's first events alone)."""
    from grandrounds.app import run_cases

    cases = repeated_cases(load_cases(ROOT / "examples" / "cases.jsonl")[0], n_cases)
    with EventStore(":memory:") as s:
        run_cases(s, cases, RunSpec(policy=EvoMedAgentPolicy(), seed=0), run_id="src")
        events = s.read("src")
    batches: list[list] = []
    current = None
    for e in events:
        if e.case_id != current or not batches:
            batches.append([])
            current = e.case_id
        batches[-1].append(e)
    return batches


def grouped(batches: list[list], per: int) -> list[list]:
    return [[e for b in batches[i:i + per] for e in b] for i in range(0, len(batches), per)]


def grandrounds_rate(folder: Path, groups: list[list], tag: str) -> float:
    news = [[NewEvent(e.decode(), e.case_id, e.causation_seq, e.meta) for e in g] for g in groups]
    with EventStore(folder / f"gr-{tag}.duckdb") as store:
        t = time.perf_counter()
        seq = -1
        for batch in news:
            store.append("run", batch, seq)
            seq += len(batch)
        dt = time.perf_counter() - t
    return sum(len(g) for g in groups) / dt


def duckdb_insert_rate(folder: Path, groups: list[list], tag: str) -> float:
    """DuckDB's part alone: the same rows, already serialised, hashed and sealed (their stored texts),
    inserted into the store's `events` table and committed a group at a time, as `append` does last."""
    with EventStore(folder / f"raw-{tag}.duckdb", codec=None) as store:
        cols_of = [[list(c) for c in zip(*[(e.run_id, e.seq, e.type, e.schema_version, e.case_id, e.causation_seq,
                                             e.canonical_payload(), e.canonical_meta(), e.chain) for e in g])]
                   for g in groups]
        conn = store.conn
        t = time.perf_counter()
        for cols in cols_of:
            conn.execute("BEGIN TRANSACTION")
            EventStore._insert_columns(conn, cols)
            conn.execute("COMMIT")
        dt = time.perf_counter() - t
    return sum(len(g) for g in groups) / dt


def eventsourcing_rate(folder: Path, groups: list[list], tag: str) -> float:
    from eventsourcing.persistence import StoredEvent as EsEvent
    from eventsourcing.sqlite import SQLiteAggregateRecorder, SQLiteDatastore

    datastore = SQLiteDatastore(str(folder / f"es-{tag}.sqlite"), originator_id_type="text")
    recorder = SQLiteAggregateRecorder(datastore)
    recorder.create_table()
    es_groups = [[EsEvent("run", e.seq, e.type, e.canonical_payload().encode("utf-8")) for e in g] for g in groups]
    t = time.perf_counter()
    for batch in es_groups:
        recorder.insert_events(batch)
    dt = time.perf_counter() - t
    datastore.close()
    return sum(len(g) for g in groups) / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    batches = case_batches(a.cases)
    folder = bench_dir("gr-bench-append-")
    modes = {"per case": batches, f"per group of {a.group} cases": grouped(batches, a.group)}
    rates: dict = {m: {"grandrounds (DuckDB)": [], "eventsourcing (SQLite)": [], "DuckDB insert alone": []}
                   for m in modes}
    for r in range(a.rounds):
        for m, groups in modes.items():
            tag = f"{r}-{len(groups)}"
            order = [("grandrounds (DuckDB)", grandrounds_rate), ("eventsourcing (SQLite)", eventsourcing_rate),
                     ("DuckDB insert alone", duckdb_insert_rate)]
            for name, fn in (order if r % 2 == 0 else order[::-1]):  # alternate who goes first
                rates[m][name].append(fn(folder, groups, tag))
    events = sum(len(b) for b in batches)
    out = {"cases": a.cases, "events": events, "events_per_case": round(events / len(batches), 1),
           "rounds": a.rounds, "loadavg_1min": round(os.getloadavg()[0], 1), "events_per_s": {}}
    for m, by in rates.items():
        gr, es, raw = by["grandrounds (DuckDB)"], by["eventsourcing (SQLite)"], by["DuckDB insert alone"]
        out["events_per_s"][m] = {"grandrounds": [round(min(gr)), round(max(gr))],
                                  "eventsourcing": [round(min(es)), round(max(es))],
                                  "duckdb_insert_alone": [round(min(raw)), round(max(raw))],
                                  "ratio_per_round": [round(g / e, 2) for g, e in zip(gr, es)]}
    if a.json:
        print(json.dumps(out))
        return
    print(f"appends of {events} events ({out['events_per_case']} per case, {a.cases} cases), {a.rounds} rounds, "
          f"events/s min-max (load average {out['loadavg_1min']} on {os.cpu_count()} CPUs)")
    for m, v in out["events_per_s"].items():
        print(f"  {m:<26} grandrounds {v['grandrounds'][0]:>7}-{v['grandrounds'][1]:<7} "
              f"eventsourcing {v['eventsourcing'][0]:>7}-{v['eventsourcing'][1]:<7} "
              f"DuckDB insert alone {v['duckdb_insert_alone'][0]:>7}-{v['duckdb_insert_alone'][1]:<7} "
              f"grandrounds/eventsourcing {v['ratio_per_round']}")


if __name__ == "__main__":
    main()
