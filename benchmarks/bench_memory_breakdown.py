"""Where resident memory goes as a run grows (issue 17 item 4): one in-process run, sampled every N cases.

    python benchmarks/bench_memory_breakdown.py [--cases 5000] [--every 1000 | --at 1000,3000,10000]
                                                [--policy evo-medagent] [--no-events-pk] [--isolate-index]
                                                [--heap-sites N [--frames 8]] [--json]

The example cases repeated under new ids (as bench_memory.py), sim backbone, MiniLM with a warm
cache (a 78-case run first embeds every text). Printed per sample, side by side: resident memory
(RSS), what DuckDB says it holds (`duckdb_memory()`), the Python heap (tracemalloc; numpy arrays
included, hnswlib's C++ graph not), the run's memory items, and, once, what the case file costs
held: parsed whole (`load_cases`, what `grandrounds run` did before) and streamed (`open_cases`, what
it does now: offsets only). The run reads the streamed one. The rest of RSS growth is the allocator's
and native libraries' (hnswlib builds its graph once a memory passes 4,096 items).

DuckDB's count is split by its own tags: ART_INDEX is the in-memory index behind the PRIMARY KEY
(run_id, seq) of `events` (and of the small tables), BASE_TABLE the file's blocks held in DuckDB's
buffer pool, IN_MEMORY_TABLE rows committed to the WAL but not checkpointed into the file yet.
"trimmed" is RSS growth after glibc's malloc_trim (free pages handed back). `--duckdb-set
checkpoint_threshold=1MB --duckdb-set memory_limit=16MB` measures DuckDB settings. The
Python heap is split per source file of grandrounds (what grew most between the first and the last
sample); `--heap-sites N` also prints the N allocation sites (tracebacks of `--frames` frames,
grandrounds' own frames shown) whose live bytes grew most between the first and the last sample,
the way to find per-case state kept in memory. `--no-events-pk` runs the same thing with `events` created without its PRIMARY KEY (a
measurement only: that store has lost its guard against two writers appending the same seq).
`--isolate-index` then appends the run's events again, in a fresh process per variant, into a
scratch DuckDB file with and without the PRIMARY KEY (`INSERT ... SELECT` from a Parquet copy, 64
cases per transaction, as the run's group commit): the difference is the index alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_memory import case_file  # noqa: E402
from benchmarks.common import bench_dir  # noqa: E402
from grandrounds.app import run_cases  # noqa: E402
from grandrounds.handlers.cases import load_cases, open_cases  # noqa: E402
from grandrounds.handlers.policies.config import load_policy  # noqa: E402
from grandrounds.handlers.runs import RunSpec  # noqa: E402
from grandrounds.store.dbsettings import apply_settings, duckdb_settings  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402
from grandrounds.store.read_model import EventLog  # noqa: E402


def trimmed_rss_mb() -> float:
    """RSS after glibc hands its free pages back (malloc_trim): what is held, not the allocator's spare room."""
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb()


def peak_mb() -> float:
    """Peak RSS of this process so far (ru_maxrss)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20


DUCK_TAGS = ("ART_INDEX", "BASE_TABLE", "IN_MEMORY_TABLE")


def duckdb_tags(conn) -> dict[str, float]:
    """MB DuckDB holds per tag (every tag that holds any)."""
    rows = conn.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall()
    out = {t: 0.0 for t in DUCK_TAGS}
    out.update({tag: used / 2 ** 20 for tag, used in rows if used})
    return {k: round(v, 2) for k, v in out.items()}


def file_mb(conn) -> float:
    """Blocks the database file uses (PRAGMA database_size), MB."""
    _, _, block_size, _, used_blocks, *_ = conn.execute("PRAGMA database_size").fetchone()
    return round(block_size * used_blocks / 2 ** 20, 1)


def heap_by_file(snapshot: tracemalloc.Snapshot) -> dict[str, int]:
    """Bytes traced per allocating source file, grandrounds' files by name and the rest as `other`."""
    out: dict[str, int] = {}
    for stat in snapshot.statistics("filename"):
        name = stat.traceback[0].filename
        key = str(Path(name).relative_to(ROOT)) if name.startswith(str(ROOT)) else "other"
        out[key] = out.get(key, 0) + stat.size
    return out


def heap_sites(first: tracemalloc.Snapshot, last: tracemalloc.Snapshot, n: int, span: int) -> list[dict]:
    """The n tracebacks whose live bytes grew most from `first` to `last`, per case; innermost frame first,
    frames outside grandrounds kept only as the innermost one (where the bytes were allocated)."""
    out = []
    for stat in last.compare_to(first, "traceback")[:n]:
        if stat.size_diff <= 0:
            break
        frames = []
        for i, fr in enumerate(reversed(stat.traceback)):  # innermost first
            mine = fr.filename.startswith(str(ROOT))
            if i == 0 or mine:
                name = str(Path(fr.filename).relative_to(ROOT)) if mine else Path(fr.filename).name
                frames.append(f"{name}:{fr.lineno}")
        out.append({"bytes_per_case": round(stat.size_diff / span, 1),
                    "count_per_case": round(stat.count_diff / span, 2), "frames": frames})
    return out


ISOLATE = """
import json, sys
import duckdb
pq, db, pk, bounds = sys.argv[1], sys.argv[2], sys.argv[3] == "pk", json.loads(sys.argv[4])
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20
conn = duckdb.connect(db)
# a scratch table of the same columns, named apart from the store's own `events`
conn.execute("CREATE TABLE events_copy (run_id VARCHAR NOT NULL, seq BIGINT NOT NULL, type VARCHAR NOT NULL, "
             "schema_version INTEGER NOT NULL, case_id VARCHAR, causation_seq BIGINT, payload JSON NOT NULL, "
             "meta JSON NOT NULL, chain VARCHAR NOT NULL" + (", PRIMARY KEY (run_id, seq))" if pk else ")"))
start, out, lo = rss_mb(), [], 0
for cases, groups in bounds:
    for hi in groups:
        conn.execute("INSERT INTO events_copy SELECT * FROM read_parquet(?) WHERE seq >= ? AND seq < ?", [pq, lo, hi])
        lo = hi
    tags = dict(conn.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall())
    out.append({"cases": cases, "rss_growth_mb": round(rss_mb() - start, 1),
                "art_index_mb": round(tags["ART_INDEX"] / 2 ** 20, 2),
                "duckdb_mb": round(sum(tags.values()) / 2 ** 20, 2)})
print(json.dumps(out))
"""


def isolate_index(store: EventStore, run_id: str, at: list[int], work: Path, group: int = 64) -> dict:
    """The run's events appended again into scratch files with and without the PRIMARY KEY."""
    log = EventLog(store)  # rows as stored, through the read model (no SQL over `events` up here)
    first_of_case: dict[str, int] = {}
    end = 0
    for row in log.stored_rows([run_id]):
        seq, case_id = row[1], row[4]
        end = seq + 1
        if case_id is not None:
            first_of_case.setdefault(case_id, seq)
    starts = [*sorted(first_of_case.values()), end]  # case k is starts[k]..starts[k+1], then the end
    pq = work / "events.parquet"
    log.copy_to_parquet([run_id], str(pq))
    bounds, done = [], 0
    for cases in at:
        cut = min(cases, len(starts) - 1)
        bounds.append((cases, [starts[min(c, cut)] for c in range(done + group, cut + group, group)]))
        done = cut
    out = {"events": end}
    for variant in ("pk", "no_pk"):
        db = work / f"scratch-{variant}.duckdb"
        db.unlink(missing_ok=True)
        res = subprocess.run([sys.executable, "-c", ISOLATE, str(pq), str(db), variant, json.dumps(bounds)],
                             capture_output=True, text=True, check=True)
        out[variant] = json.loads(res.stdout)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--at", default="", help="sample after these case counts (comma separated) instead of --every")
    ap.add_argument("--no-events-pk", action="store_true", help="create `events` without its PRIMARY KEY")
    ap.add_argument("--duckdb-set", action="append", default=[], metavar="NAME=VALUE",
                    help="a DuckDB setting for the run's file, e.g. checkpoint_threshold=1MB, memory_limit=64MB")
    ap.add_argument("--isolate-index", action="store_true",
                    help="then append the run's events into scratch files with and without the PRIMARY KEY")
    ap.add_argument("--heap-sites", type=int, default=0, metavar="N",
                    help="print the N allocation sites whose live bytes grew most, first to last sample")
    ap.add_argument("--frames", type=int, default=8, help="traceback depth traced for --heap-sites")
    ap.add_argument("--policy", default="evo-medagent")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    at = [int(x) for x in a.at.split(",")] if a.at else list(range(a.every, a.cases + 1, a.every))
    if a.no_events_pk:
        import grandrounds.store.recorder as recorder  # where the schema is read
        recorder.SCHEMA = recorder.SCHEMA.replace(",\n    PRIMARY KEY (run_id, seq)\n", "\n", 1)
        assert "PRIMARY KEY (run_id, seq)" not in recorder.SCHEMA
    work = bench_dir("gr-bench-memory-breakdown-")
    path = case_file(work, a.cases)
    gc.collect()
    tracemalloc.start()
    parsed = load_cases(path)[0]
    case_list_mb = tracemalloc.get_traced_memory()[0] / 2 ** 20
    del parsed
    tracemalloc.stop()
    gc.collect()
    tracemalloc.start()
    cases = open_cases(path)[0]
    streamed_mb = tracemalloc.get_traced_memory()[0] / 2 ** 20
    tracemalloc.stop()
    store = EventStore(work / "run.duckdb")
    if a.duckdb_set:  # the store's own parser and SET (store/dbsettings.py): the names it takes, checked
        apply_settings(store.conn, duckdb_settings(",".join(a.duckdb_set)))
    spec = RunSpec(policy=load_policy(a.policy))
    run_cases(store, cases[:78], spec, run_id="warm")  # loads MiniLM (if needed) and warms the cache
    gc.collect()
    start = trimmed_rss_mb()
    tracemalloc.start(a.frames if a.heap_sites else 1)
    rows: list[dict] = []
    holder: dict = {}
    heaps: list[dict[str, int]] = []
    snaps: list[tracemalloc.Snapshot] = []  # first and last, for --heap-sites

    def on_case(index: int, ok: bool) -> None:
        if index + 1 in at:
            tags = duckdb_tags(store.conn)
            snap = tracemalloc.take_snapshot()
            heaps.append(heap_by_file(snap))
            if a.heap_sites:
                snaps[min(len(snaps), 1):] = [snap]  # keep the first and the latest
            rows.append({"cases": index + 1, "rss_mb": round(rss_mb(), 1),
                         "rss_growth_mb": round(rss_mb() - start, 1),
                         "duckdb_mb": round(sum(tags.values()), 1), "duckdb": tags,
                         "db_file_mb": file_mb(store.conn),
                         "python_heap_mb": round(tracemalloc.get_traced_memory()[0] / 2 ** 20, 1),
                         "rss_growth_trimmed_mb": round(trimmed_rss_mb() - start, 1),
                         "peak_rss_mb": round(peak_mb(), 1)})

    import grandrounds.streams.embedded as embedded

    original = embedded.EmbeddedRunner.run

    async def run(self, cases, on_case=None):  # keep the context, to count the memory's items
        holder["ctx"] = self.ctx
        return await original(self, cases, on_case)

    embedded.EmbeddedRunner.run = run
    run_cases(store, cases, spec, run_id="big", on_case=on_case)
    peak_end = peak_mb()  # after the run's end: its final checkpoint and fingerprint
    counts = holder["ctx"].projection.state.counts()
    items = {k: v for k, v in counts.items() if isinstance(v, int)}
    tracemalloc.stop()
    grew: dict[str, float] = {}
    if len(heaps) > 1:
        span = rows[-1]["cases"] - rows[0]["cases"]
        diff = {k: heaps[-1].get(k, 0) - heaps[0].get(k, 0) for k in {*heaps[0], *heaps[-1]}}
        grew = {k: round(v / 1024 / span * 1000, 1)  # KB per 1,000 cases
                for k, v in sorted(diff.items(), key=lambda kv: -kv[1])[:8] if v > 0}
    out = {"policy": a.policy, "cases": a.cases, "events_pk": not a.no_events_pk, "duckdb_set": a.duckdb_set, "case_list_mb": round(case_list_mb, 1),
           "case_list_kb_per_case": round(case_list_mb * 1024 / a.cases, 2),
           "streamed_case_file_mb": round(streamed_mb, 2),
           "streamed_kb_per_case": round(streamed_mb * 1024 / a.cases, 3), "memory_items": items, "samples": rows,
           "peak_rss_after_run_mb": round(peak_end, 1),
           "heap_growth_kb_per_1000_cases": grew}
    if a.heap_sites and len(snaps) == 2:
        out["heap_sites"] = heap_sites(snaps[0], snaps[1], a.heap_sites, rows[-1]["cases"] - rows[0]["cases"])
    if a.isolate_index:
        out["isolated_index"] = isolate_index(store, "big", at, work)
    if a.json:
        print(json.dumps(out))
        return
    print(f"{a.policy}, sim, {a.cases} cases; case file parsed whole {out['case_list_mb']} MB "
          f"({out['case_list_kb_per_case']} KB/case), streamed {out['streamed_case_file_mb']} MB "
          f"({out['streamed_kb_per_case']} KB/case); memory at the end: {items}")
    if a.no_events_pk:
        print("`events` WITHOUT its PRIMARY KEY (measurement only)")
    print("DuckDB MB: all, ART_INDEX (primary keys), BASE_TABLE (the file's blocks in its buffer pool),"
          " IN_MEMORY_TABLE (rows not checkpointed yet); file MB: PRAGMA database_size's used blocks")
    print(f"{'cases':>7} {'RSS MB':>8} {'growth':>8} {'trimmed':>8} {'DuckDB':>8} {'ART idx':>8} {'blocks':>8} "
          f"{'unsaved':>8} {'file MB':>8} {'Py heap':>8}")
    for r in rows:
        d = r["duckdb"]
        print(f"{r['cases']:>7} {r['rss_mb']:>8} {r['rss_growth_mb']:>8} {r['rss_growth_trimmed_mb']:>8} "
              f"{r['duckdb_mb']:>8} {d['ART_INDEX']:>8} {d['BASE_TABLE']:>8} {d['IN_MEMORY_TABLE']:>8} "
              f"{r['db_file_mb']:>8} {r['python_heap_mb']:>8}")
    print(f"peak RSS at the last sample {rows[-1]['peak_rss_mb']} MB, after the run's end (final checkpoint, "
          f"fingerprint) {out['peak_rss_after_run_mb']} MB")
    if grew:
        print(f"Python heap growth, KB per 1,000 cases, {rows[0]['cases']} -> {rows[-1]['cases']}: "
              + ", ".join(f"{k} {v}" for k, v in grew.items()))
    for site in out.get("heap_sites", []):
        print(f"  +{site['bytes_per_case']:>7} B/case, +{site['count_per_case']:>6} blocks/case  "
              + " <- ".join(site["frames"]))
    if a.isolate_index:
        iso = out["isolated_index"]
        print(f"the run's {iso['events']} events appended again into a scratch file (fresh process each):")
        print(f"{'cases':>7} {'PK: RSS+':>9} {'ART idx':>8} {'DuckDB':>8} {'no PK: RSS+':>12} {'ART idx':>8} {'DuckDB':>8}")
        for p, n in zip(iso["pk"], iso["no_pk"]):
            print(f"{p['cases']:>7} {p['rss_growth_mb']:>9} {p['art_index_mb']:>8} {p['duckdb_mb']:>8} "
                  f"{n['rss_growth_mb']:>12} {n['art_index_mb']:>8} {n['duckdb_mb']:>8}")


if __name__ == "__main__":
    main()
