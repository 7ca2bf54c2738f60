"""What a list of runs shows about each (the `grandrounds ui` runs page): spec, outcome,
fingerprint, and what can be checked without re-executing (hash chain, completeness).

"verified" here is the cheap part of `grandrounds verify`: the hash chain recomputes from the
stored events and every received case completed. Re-execution (fingerprint identical) is
`replay.verify.verify_run`, run on request because it costs a replay.
"""

from __future__ import annotations

from grandrounds.replay.caselog import require_spec
from grandrounds.replay.stats import outcomes_of, summarise
from grandrounds.store.eventstore import EventStore


def received_count(store: EventStore, run_id: str) -> int:
    return sum(1 for _ in store.iter(run_id, types=["case.received"]))


def run_row(store: EventStore, run_id: str, chain: bool = True) -> dict:
    """One run's line: spec, cases, accuracy, fingerprint, chain intact, complete."""
    spec = require_spec(store, run_id)
    s = summarise(outcomes_of(store, run_id))
    received = received_count(store, run_id)
    chain_break = store.verify_chain(run_id) if chain else None
    return {
        "run_id": run_id,
        "policy": spec.policy.name,
        "backbone": spec.backbone,
        "model": spec.model,
        "seed": spec.seed,
        "source": spec.source,
        "tools": dict(spec.tools),
        "cases": s["cases"],
        "received": received,
        "correct": s["correct"],
        "accuracy": s["accuracy"],
        "events": store.last_seq(run_id) + 1,
        "fingerprint": store.fingerprint(run_id),
        "chain_intact": chain_break is None,
        "chain_break_seq": chain_break,
        "complete": received > 0 and s["cases"] == received,
    }


def overview(store: EventStore) -> list[dict]:
    """Every run in the file, by run id."""
    return [run_row(store, r.run_id) for r in store.runs()]


def replays_of(store: EventStore, run_id: str) -> list[str]:
    """Runs replayed from `run_id` (`grandrounds replay --from RUN` names the parent in the spec)."""
    out = []
    for r in store.runs():
        if r.run_id == run_id:
            continue
        spec = require_spec(store, r.run_id)
        if spec.source == run_id:
            out.append(r.run_id)
    return out
