"""`audit items`: a run's memory as it was at a point of the stream (time travel)."""

from __future__ import annotations

from grandrounds.replay.audit_common import AsOf, AuditInputError, AuditMemory, memory_at, resolve_as_of, utility_of
from grandrounds.replay.caselog import require_spec
from grandrounds.store.eventstore import EventStore

KINDS = ("rule", "episode", "tool")
POLICY_KINDS = {"skemex": "skill", "selsm": "selsm-record", "retrosum": "experience"}
"""The item kind of each policy whose memory lives in a projection part (store/policy_memory.py)."""


def items(store: EventStore, run_id: str, as_of_case: int | None = None, as_of_seq: int | None = None,
          kinds: list[str] | None = None, status: str | None = None, sort: str = "id",
          limit: int | None = None) -> dict:
    known = (*KINDS, *POLICY_KINDS.values())
    for k in kinds or []:
        if k not in known:
            raise AuditInputError(f"unknown --kind {k!r} (one of {', '.join(known)})")
    if sort not in ("id", "utility"):
        raise AuditInputError("--sort is id or utility")
    spec = require_spec(store, run_id)
    part_kind = POLICY_KINDS.get(spec.policy.name)
    allowed = kinds_of(spec.policy.name)
    for k in kinds or []:
        if k not in allowed:
            raise AuditInputError(f"--kind {k}: run {run_id!r} uses policy {spec.policy.name}, whose memory holds "
                                  f"{', '.join(allowed)} items")
    kinds = list(kinds or allowed)
    at = resolve_as_of(store, run_id, as_of_case, as_of_seq)
    state = memory_at(store, run_id, at.seq)
    result = render_items(run_id, spec.policy, state, at, [k for k in kinds if k in KINDS], status, sort, limit)
    result["policy"], result["kinds"], result["policy_kind"] = spec.policy.name, list(allowed), part_kind
    if part_kind and part_kind in kinds:
        extra = policy_items(store, run_id, at.seq, status, sort)
        result["counts"][part_kind] = len(extra)
        result["items"] = (extra + result["items"])[:limit] if limit else extra + result["items"]
        result["total"] += len(extra)
    return result


def kinds_of(policy_name: str) -> tuple[str, ...]:
    """The item kinds a policy's memory holds: Evo-MedAgent's three stores (also the memory-free
    baseline's, which are empty but for tools), or the policy's own kind and tools."""
    part_kind = POLICY_KINDS.get(policy_name)
    return (part_kind, "tool") if part_kind else KINDS


def policy_items(store: EventStore, run_id: str, upto_seq: int, status: str | None, sort: str) -> list[dict]:
    """Items of a SkeMex / SELSM / RetroSum memory as of `upto_seq`: the projection folded that far
    (its indexes need the embeddings, all cached in the file when the run wrote them)."""
    from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
    from grandrounds.store.projection import rebuild

    proj = rebuild(store, run_id, EmbeddingCache(shared_minilm(), store.conn), upto_seq=upto_seq)
    part = proj.state.policy_memory
    found = [i for i in part.audit_items() if status in (None, i["status"])] if part is not None else []
    if sort == "utility":
        found.sort(key=lambda i: (-(i.get("utility") or 0.0), i["id"]))
    return found


def rule_item(rule, state: AuditMemory, policy) -> dict:
    return {
        "kind": "rule", "id": rule.rule_id, "status": rule.status, "priority": rule.priority,
        "utility": utility_of(rule, state, policy),
        "selected": rule.selected, "helpful": rule.helpful, "harmful": rule.harmful,
        "text": rule.text, "trigger": rule.trigger, "source_case_id": rule.source_case_id,
        "created_seq": rule.created_seq, "derived_from": rule.derived_from, "edits": rule.edits,
    }


def episode_item(ep) -> dict:
    return {
        "kind": "episode", "id": ep.episode_id, "status": "stored", "case_id": ep.case_id,
        "answer": ep.answer, "gold": ep.gold, "correct": ep.correct, "summary": ep.summary,
        "guideline": ep.guideline, "trigger": ep.trigger, "created_seq": ep.created_seq,
    }


def tool_item(t) -> dict:
    return {"kind": "tool", "id": t.name, "status": t.label, "label": t.label, "helpful": t.helpful,
            "harmful": t.harmful, "misuse": t.misuse, "total": t.total}


def render_items(run_id: str, policy, state: AuditMemory, at: AsOf, kinds: list[str], status: str | None,
                 sort: str, limit: int | None) -> dict:
    out: list[dict] = []
    if "rule" in kinds:
        rules = [rule_item(r, state, policy) for r in state.rules.values()]
        if status:
            rules = [r for r in rules if r["status"] == status]
        if sort == "utility":
            rules.sort(key=lambda r: (-(r["utility"] or 0.0), r["id"]))
        out += rules
    if "episode" in kinds and status in (None, "stored"):
        out += [episode_item(e) for e in state.episodes.values()]
    if "tool" in kinds:
        out += [tool_item(state.tools[n]) for n in sorted(state.tools) if status in (None, state.tools[n].label)]
    total = len(out)
    if limit:
        out = out[:limit]
    active = state.active_rules()
    return {
        "run_id": run_id,
        "as_of": at.as_dict(),
        "counts": {
            "rules_active": len(active),
            "rules_retired": sum(1 for r in state.rules.values() if r.status == "retired"),
            "episodes": len(state.episodes),
            "tools": {n: state.tools[n].label for n in sorted(state.tools)},
            "feedback": state.feedback_count,
            "cases_completed": state.cases_completed,
            "correct": state.correct,
        },
        "total": total,
        "items": out,
    }
