"""Token usage and latency of a run's model calls, per case, for the run summary.

Latency comes from event meta (wall clock): reported, never folded into state. So do the transport
failures a call survived (`failed_attempts` in the meta of the exchange that succeeded): they count in
`attempts` and `failed_attempts` here without being events.
"""

from __future__ import annotations

from grandrounds.store.event_types import CaseReceived
from grandrounds.store.llm_events import CaseFailed, LLMExchange


def llm_usage(store, run_id: str) -> dict:
    order: list[str] = []
    per: dict[str, dict] = {}
    calls = attempts = errors = 0
    failed: list[dict] = []
    for e in store.iter(run_id, types=[CaseReceived.event_type, LLMExchange.event_type, CaseFailed.event_type]):
        if e.type == CaseReceived.event_type:
            order.append(e.case_id)
            per[e.case_id] = {"case_id": e.case_id, "calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                              "latency_ms": 0.0}
            continue
        if e.type == CaseFailed.event_type:
            failed.append({"case_id": e.case_id, "stage": e.payload["stage"], "reason": e.payload["reason"]})
            continue
        retried = len(e.meta.get("failed_attempts") or ())  # transport failures survived (meta, not events)
        attempts += 1 + retried
        errors += retried
        row = per.setdefault(e.case_id, {"case_id": e.case_id, "calls": 0, "prompt_tokens": 0,
                                         "completion_tokens": 0, "latency_ms": 0.0})
        row["latency_ms"] = round(row["latency_ms"] + float(e.meta.get("latency_ms", 0.0)), 3)
        if e.payload["outcome"] != "ok":
            errors += 1
            continue
        calls += 1
        row["calls"] += 1
        usage = e.payload.get("usage") or {}
        row["prompt_tokens"] += int(usage.get("prompt_tokens", 0))
        row["completion_tokens"] += int(usage.get("completion_tokens", 0))
    cases = [per[c] for c in order if c in per]
    n = len(cases) or 1
    prompt = sum(c["prompt_tokens"] for c in cases)
    completion = sum(c["completion_tokens"] for c in cases)
    return {
        "calls": calls, "attempts": attempts, "failed_attempts": errors,
        "prompt_tokens": prompt, "completion_tokens": completion,
        "tokens_per_case": round((prompt + completion) / n, 3),
        "latency_ms_per_case": round(sum(c["latency_ms"] for c in cases) / n, 3),
        "per_case": cases,
        "failed_cases": failed,
    }
