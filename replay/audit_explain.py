"""`audit explain`: one case end to end — what memory gave it, what the agent did, what it changed.

For every rule and episode the case retrieved, explain also says where it came from (the
case and reflection that created it), so a later case answered from memory points straight
at the earlier case that taught it.
"""

from __future__ import annotations


from grandrounds.replay.audit_common import case_indexes, resolve_case, short
from grandrounds.replay.caselog import require_spec
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog
from grandrounds.store.sealing import ERASED, is_erased_case

CHANGE_TYPES = ("episode.stored", "rule.added", "rule.edited", "rule.priority_changed", "rule.retired",
                "tool.label_changed")


def _provenance(store: EventStore, run_id: str, rule_ids: list[str], episode_ids: list[str],
                indexes: dict[str, int]) -> dict[str, dict]:
    """item id -> the event that created it (seq, case, reflection; a rule also its text then)."""
    out: dict[str, dict] = {}
    log = EventLog(store)
    for ids, type_, id_field in ((rule_ids, "rule.added", "rule_id"), (episode_ids, "episode.stored", "episode_id")):
        if not ids:
            continue
        wanted = set(ids)
        for e in log.events(run_id, types=[type_]):
            p = e.payload
            if p[id_field] in wanted:
                out[p[id_field]] = {"created_seq": e.seq, "from_case_id": e.case_id,
                                    "from_case_index": indexes.get(e.case_id), "reflection_seq": e.causation_seq}
                if type_ == "rule.added":  # a rule's text changes with patches: what it said when created
                    out[p[id_field]]["text_at_creation"] = p["text"]
    return out


def _change(type_: str, p: dict) -> str:
    if type_ == "episode.stored":
        return f"stored episode {p['episode_id']} ({'correct' if p['correct'] else 'wrong'} answer {p['answer']}, gold {p['gold']})"
    if type_ == "rule.added":
        return f"added {p['rule_id']} P{p['priority']}: {short(p['text'], 90)}"
    if type_ == "rule.edited":
        return f"patched {p['rule_id']}: {short(p['text'], 90)} — {p.get('reason', '')}"
    if type_ == "rule.priority_changed":
        return f"{p['rule_id']} priority P{p['old']} → P{p['new']} — {p.get('reason', '')}"
    if type_ == "rule.retired":
        return f"retired {p['rule_id']} — {p.get('reason', '')}"
    if type_ == "tool.label_changed":
        return f"tool {p['tool']}: {p['old']} → {p['new']} (n={p['n']})"
    return type_


def explain(store: EventStore, run_id: str, case_ref: str) -> dict:
    require_spec(store, run_id)
    case_id, index = resolve_case(store, run_id, case_ref)
    indexes = case_indexes(store, run_id)
    events = store.read(run_id, case_id=case_id)
    by_type: dict[str, list] = {}
    for e in events:
        by_type.setdefault(e.type, []).append(e)

    def one(type_: str) -> dict | None:
        found = by_type.get(type_)
        return found[0].payload if found else None

    received = one("case.received") or {}
    case = received.get("case", {})
    memory = one("memory.retrieved") or {}
    answer = one("answer.given")
    fb = one("feedback.recorded")
    reflection = one("reflection.recorded")
    failed = one("case.failed")
    completed = one("case.completed")

    rules = memory.get("rules", [])
    episodes = memory.get("episodes", [])
    prov = _provenance(store, run_id, [r["rule_id"] for r in rules], [e["episode_id"] for e in episodes], indexes)
    retrieved_rules = [{**r, "rank": i, **prov.get(r["rule_id"], {})} for i, r in enumerate(rules, start=1)]
    retrieved_episodes = [{**e, "rank": i, **prov.get(e["episode_id"], {})} for i, e in enumerate(episodes, start=1)]

    followed = None
    source = (answer or {}).get("source", "")
    kind, _, item_id = source.partition(":")
    if kind in ("rule", "episode"):
        pool = retrieved_rules if kind == "rule" else retrieved_episodes
        item = next((x for x in pool if x.get(f"{kind}_id") == item_id), None)
        if item is not None:
            followed = {"kind": kind, "id": item_id,
                        "text": item.get("text") if kind == "rule" else item.get("guideline"),
                        "from_case_id": item.get("from_case_id") or item.get("source_case_id"),
                        "from_case_index": item.get("from_case_index"),
                        "created_seq": item.get("created_seq"), "reflection_seq": item.get("reflection_seq")}
            origin = followed["from_case_id"]
            if origin:
                src = store.read(run_id, case_id=origin, types=["case.received"])
                if src:
                    origin_case = src[0].payload["case"]  # the erased stand-in once that subject is erased
                    followed["from_case_question"] = (origin_case.get("question") or origin_case.get("instruction")
                                                      or ERASED)
    elif kind == "tool":
        followed = {"kind": "tool", "id": item_id}

    changes = [{"seq": e.seq, "type": e.type, "description": _change(e.type, e.payload), "payload": e.payload}
               for e in events if e.type in CHANGE_TYPES]
    llm = [{"seq": e.seq, "stage": e.payload.get("stage"), "purpose": e.payload.get("purpose"),
            "outcome": e.payload.get("outcome")} for e in by_type.get("llm.exchange", [])]
    return {
        "run_id": run_id,
        "case_id": case_id,
        "case_index": index,
        "case": case,
        "content_erased": is_erased_case(case),
        "seqs": [events[0].seq, events[-1].seq] if events else None,
        "memory_seq": memory.get("memory_seq"),
        "retrieved": {"rules": retrieved_rules, "episodes": retrieved_episodes,
                      "tool_guidance": memory.get("tool_guidance", [])},
        "injected_prefix": memory.get("prefix", ""),
        "steps": (answer or {}).get("steps", []) or (failed or {}).get("steps", []),
        "tool_calls": (answer or {}).get("tool_calls", []),
        "answer": (answer or {}).get("answer"),
        "answer_source": source or None,
        "followed": followed,
        "feedback": fb,
        "correct": (completed or {}).get("correct"),
        "reflection": reflection,
        "memory_changes": changes,
        "failed": failed,
        "llm_exchanges": llm,
        "completed": completed is not None,
    }
