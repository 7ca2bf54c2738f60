"""Per-call cost of the LLM gateway against a local fake OpenAI-compatible server.

Compares `LLMGateway.complete` (request hash, exchange event, retry bookkeeping, emit into
a real EventWriter) with the bare `openai.AsyncOpenAI` client on the same server, in
interleaved rounds, and times serving a recorded exchange (the `record` backend).
Targets (issue 3): gateway adds ≤ 1 ms per call; serving a recorded exchange ≤ 1 ms.

    .venv/bin/python benchmarks/bench_gateway.py [--calls 300] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fake_openai_server import FakeOpenAI  # noqa: E402
from grandrounds.handlers.context import EventWriter  # noqa: E402
from grandrounds.handlers.llm.gateway import LLMGateway  # noqa: E402
from grandrounds.handlers.llm.record import RecordedExchanges, RecordedTransport  # noqa: E402
from grandrounds.handlers.llm.recorder import stage_recorder  # noqa: E402
from grandrounds.handlers.llm.transport import OpenAITransport  # noqa: E402
from grandrounds.store.eventstore import EventStore  # noqa: E402
from grandrounds.store.projection import MemoryProjection  # noqa: E402

MODEL = "bench-model"
MESSAGES = [
    {"role": "system", "content": "You are a clinical reasoning agent answering a multiple-choice case.\n"
                                  "Every turn: first <reasoning>...</reasoning>, then exactly ONE action.\n"
                                  "Available tools: none — answer with <response>."},
    {"role": "user", "content": "## Memory\n## Protocol\nAnswer with one letter.\n- [P1] If the presentation "
                                "includes fever, neck stiffness: favour 'Bacterial meningitis'.\n\n"
                                "## Case (category: infectious)\n" + "A 25-year-old man presents with fever. " * 20 +
                                "\n\nOptions:\nA) Sickle cell crisis\nB) Bacterial meningitis\nC) Viral meningitis"},
]


def _writer() -> EventWriter:
    store = EventStore(":memory:")
    return EventWriter(store, "bench", MemoryProjection(8))


async def _time(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def bench(calls: int, rounds: int) -> dict:
    server = FakeOpenAI().start()
    try:
        transport = OpenAITransport(server.base_url, "bench-key")
        bare = transport.client  # the same client object: only the gateway's work differs
        gateway = LLMGateway(transport, MODEL)
        writer = _writer()
        recorder = stage_recorder(writer, "case-1", "act")

        async def bare_call():
            await bare.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0.0)

        async def gateway_call():
            await gateway.complete(MESSAGES, recorder, "react-step-1")
            if len(writer.pending) > 1000:
                writer.pending.clear()

        await _time(bare_call, 30)
        await _time(gateway_call, 30)
        bare_ms, gw_ms, round_diffs, paired = [], [], [], []
        for r in range(rounds):
            b, g = [], []
            for i in range(calls):  # alternate call by call (order flipped each round) so drift cancels
                first, second = (bare_call, gateway_call) if (i + r) % 2 == 0 else (gateway_call, bare_call)
                t1 = (await _time(first, 1))[0]
                t2 = (await _time(second, 1))[0]
                tb, tg = (t1, t2) if first is bare_call else (t2, t1)
                b.append(tb)
                g.append(tg)
                paired.append(tg - tb)
            bare_ms += b
            gw_ms += g
            round_diffs.append(statistics.median(g) - statistics.median(b))
        await transport.aclose()

        # record backend: serve `calls` recorded exchanges by hash, no server involved
        sample = writer.pending[-1].payload
        rec = RecordedExchanges("bench-source", {sample.request_hash: deque([sample] * (calls * rounds))})
        served_gateway = LLMGateway(RecordedTransport(rec), MODEL)
        rec_writer = _writer()
        rec_recorder = stage_recorder(rec_writer, "case-1", "act")

        async def served_call():
            await served_gateway.complete(MESSAGES, rec_recorder, "react-step-1")

        served_ms = await _time(served_call, calls * rounds)

        # the gateway's own work (hash, event build, emit) with an instant transport
        class Instant:
            served = "live"

            async def send(self, call):
                return reply

            async def aclose(self):
                return None

        from grandrounds.handlers.llm.transport import RawReply
        reply = RawReply(sample.response or "", "stop", sample.usage)
        instant = LLMGateway(Instant(), MODEL)
        own_recorder = stage_recorder(_writer(), "c", "act")
        own_ms = await _time(lambda: instant.complete(MESSAGES, own_recorder, "p"), 2000)
    finally:
        server.stop()
    med = statistics.median
    return {
        "calls_per_round": calls, "rounds": rounds,
        "bare_client_ms_median": round(med(bare_ms), 3),
        "gateway_ms_median": round(med(gw_ms), 3),
        "gateway_overhead_ms_median": round(med(gw_ms) - med(bare_ms), 3),
        "gateway_overhead_ms_per_round": [round(d, 3) for d in round_diffs],
        "gateway_overhead_ms_paired_median": round(med(paired), 3),
        "gateway_own_work_ms_median": round(med(own_ms), 4),
        "record_serve_ms_median": round(med(served_ms), 4),
        "record_serve_ms_p95": round(sorted(served_ms)[int(0.95 * len(served_ms))], 4),
        "targets": {"gateway_overhead_ms": 1.0, "record_serve_ms": 1.0},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = asyncio.run(bench(args.calls, args.rounds))
    if args.json:
        print(json.dumps(result))
        return
    for k, v in result.items():
        print(f"{k:34s} {v}")


if __name__ == "__main__":
    main()
