"""What a signed run head costs: runs of the example cases with and without signing, side by side.

    python benchmarks/bench_signing.py [--cases 40] [--repeat 7]

Each repeat runs the same cases (sim backbone, warm embedding cache) as a new run in one DuckDB
file, unsigned and signed alternately (so machine noise hits both), and times the whole run and,
for the signed ones, the signing step alone (`sign_head`: one count, one HMAC-SHA256, one upsert).
`verify` with the key adds `check_head` (read the row, one HMAC, read the head), timed too.
Prints medians and the ratio signed / unsigned. The sim backbone's numbers are throughput, never
clinical accuracy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grandrounds.app import make_cache, run_cases  # noqa: E402
from grandrounds.handlers.cases import load_cases  # noqa: E402
from grandrounds.handlers.policies.config import EvoMedAgentPolicy  # noqa: E402
from grandrounds.handlers.runs import RunSpec  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402
from grandrounds.store.signing import SigningKey, check_head, sign_head  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    cases = load_cases(ROOT / "examples" / "cases.jsonl")[0][: args.cases]
    key = SigningKey(b"benchmark-signing-key-32-bytes!!", "bench")
    spec = RunSpec(policy=EvoMedAgentPolicy(), source="bench-signing")
    plain, signed, sign_only, check_only = [], [], [], []
    with EventStore(Path(tempfile.mkdtemp(prefix="gr-sign-")) / "bench.duckdb") as store:
        cache = make_cache(store)
        run_cases(store, cases, spec, run_id="warm", cache=cache)  # embeds every text once
        for i in range(args.repeat):
            t = time.perf_counter()
            run_cases(store, cases, spec, run_id=f"plain-{i}", cache=cache)
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            run_cases(store, cases, spec, run_id=f"signed-{i}", cache=cache)
            s = time.perf_counter()
            sign_head(store, f"signed-{i}", key)
            e = time.perf_counter()
            signed.append(e - t)
            sign_only.append(e - s)
            c = time.perf_counter()
            assert check_head(store, f"signed-{i}", key).ok
            check_only.append(time.perf_counter() - c)
        events = store.last_seq("plain-0") + 1
    med = statistics.median
    print(f"signed run heads: {args.cases} cases a run ({events} events), {args.repeat} runs each, median")
    print(f"  run unsigned          {med(plain) * 1000:9.1f} ms")
    print(f"  run signed            {med(signed) * 1000:9.1f} ms   ratio signed/unsigned {med(signed) / med(plain):.3f}")
    print(f"  sign_head alone       {med(sign_only) * 1000:9.3f} ms   ({med(sign_only) / med(plain) * 100:.2f}% of the run)")
    print(f"  check_head (verify)   {med(check_only) * 1000:9.3f} ms")


if __name__ == "__main__":
    main()
