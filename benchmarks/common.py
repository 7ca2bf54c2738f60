"""What the benchmark scripts share: bulk-loading a synthetic memory and summarising timings."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from grandrounds.handlers.cases import Case
from grandrounds.handlers.pipeline import process_case
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.events import NewEvent
from grandrounds.store.eventstore import EventStore

VOCAB = ("fever cough dyspnea chest pain syncope rash headache vomiting confusion tachycardia hypotension "
         "wheeze edema jaundice hematuria seizure weakness numbness pallor cyanosis murmur effusion "
         "consolidation nodule cavitation infiltrate pneumothorax cardiomegaly atelectasis").split()
"""Findings the synthetic memories are written from."""


def synthetic_words(rng: np.random.Generator, k: int = 6) -> list[str]:
    """k distinct findings: the trigger words of one synthetic memory item."""
    return [VOCAB[j] for j in rng.choice(len(VOCAB), k, replace=False)]


def unit_vector(rng: np.random.Generator, dim: int = 384) -> np.ndarray:
    """A random float32 direction: a synthetic item's embedding (the items need not mean anything)."""
    vec = rng.standard_normal(dim).astype(np.float32)
    return vec / np.linalg.norm(vec)


def child_builds(specs: Sequence[str], default: str) -> dict[str, str]:
    """`--build NAME=PYTHON` options as {name: python}; `default` (this interpreter) when none. A relative
    PYTHON (`.venv/bin/python`) is made absolute here, since children run in a work folder: abspath, not
    resolve(), as a venv's python is a link, and following it would leave the venv."""
    return {name: os.path.abspath(py) if os.sep in py else py
            for name, py in (b.split("=", 1) for b in specs)} or {"this": default}


def run_children(script: str, builds: dict[str, str], rounds: int, args: list[str], work: Path) -> dict[str, list]:
    """Run `script --child ... args` once per build per round, the builds' order reversed every other round
    (the machine's drift falls on each alike), in `work`; each child prints one JSON object."""
    import json
    import subprocess

    results: dict[str, list] = {n: [] for n in builds}
    order = list(builds.items())
    for r in range(rounds):
        for name, python in (order if r % 2 == 0 else order[::-1]):
            out = subprocess.run([python, script, *args], capture_output=True, text=True, cwd=work)
            if out.returncode != 0:
                raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
            results[name].append(json.loads(out.stdout))
    return results


def bench_dir(prefix: str) -> Path:
    """A temp folder removed when the benchmark exits (a 10k-item run leaves ~50 MB of DuckDB files)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def bench_store(prefix: str) -> tuple[EventStore, EmbeddingCache]:
    """A fresh DuckDB file in a temp folder (removed at exit) and an embedding cache on it."""
    store = EventStore(bench_dir(prefix) / "bench.duckdb")
    return store, EmbeddingCache(shared_minilm(), store.conn)


def seed_run(store: EventStore, run_id: str, spec: RunSpec, cache: EmbeddingCache, events: list[NewEvent]) -> float:
    """Start `run_id` and bulk-append `events` after its `run.started`; returns events/s appended."""
    store.append(run_id, [NewEvent(spec.started_event(cache.embedder.name))], -1)
    t = time.perf_counter()
    seq = 0
    for i in range(0, len(events), 1000):  # stage-sized batches would be smaller; this is bulk load
        batch = events[i:i + 1000]
        store.append(run_id, batch, seq)
        seq += len(batch)
    return len(events) / max(time.perf_counter() - t, 1e-9)


def ms_summary(seconds: list[float]) -> dict:
    """p50 / p90 / mean in milliseconds."""
    ms = sorted(x * 1000 for x in seconds)
    return {"p50": round(statistics.median(ms), 3), "p90": round(ms[int(0.9 * len(ms))], 3),
            "mean": round(statistics.fmean(ms), 3)}


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def repeated_cases(base: Sequence[Case], n: int) -> list[Case]:
    """The first n cases of `base` repeated, each copy under its own case id and with its question
    marked as the k-th repeat: the leakage guard matches content too (store/case_content.py), so an
    exact copy would be hidden from its original's memory items; a marked copy still retrieves them."""
    rounds = (n + len(base) - 1) // len(base)
    return [c.model_copy(update={"case_id": f"{c.case_id}-{k}",
                                 **({"question": f"{c.question} (repeat {k})"} if k else {})})
            for k in range(rounds) for c in base][:n]


def time_cases(ctx, cases: Sequence[Case], per_stage: bool = False,
               group: int = 1) -> tuple[list[float], list[float]]:
    """Process the cases through the pipeline, committing after each case (or each stage, or every
    `group` cases: the embedded runner's group commit); returns the wall time of every case (a case
    that closes a group includes the group's commit) and the time spent in each DuckDB commit."""
    times: list[float] = []
    commits: list[float] = []
    done = [0]

    async def flush(stage: str) -> None:
        if stage == "govern":
            done[0] += 1
            if done[0] % group == 0:
                t0 = time.perf_counter()
                ctx.writer.flush()
                commits.append(time.perf_counter() - t0)
        elif per_stage:
            ctx.writer.flush()

    async def go() -> None:
        for i, case in enumerate(cases):
            t0 = time.perf_counter()
            await process_case(ctx, case, i, on_stage=flush)
            times.append(time.perf_counter() - t0)
        ctx.writer.flush()

    asyncio.run(go())
    return times, commits


def print_result(out: dict, as_json: bool, width: int = 22) -> None:
    """A benchmark's result: one JSON line with --json, else one `key value` line per figure."""
    if as_json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:{width}} {v}")
