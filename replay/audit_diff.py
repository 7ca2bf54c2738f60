"""`audit diff`: two runs' memories side by side (typically two orders, or two policies, of one stream).

Item ids are per-run counters (rule-00012 of one order is not rule-00012 of another), so
items are matched by content: rules by text, episodes by the case they came from, tools by
name. Reported: items only in one run, and items in both whose utility or status differ.
"""

from __future__ import annotations

from grandrounds.replay.audit_common import memory_at, utility_of
from grandrounds.replay.caselog import require_spec
from grandrounds.replay.stats import outcomes_of, summarise
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog


def _keyed_rules(state, policy) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in state.rules.values():  # creation order: a re-added text gets a numbered key
        key, n = r.text, 1
        while key in out:
            n += 1
            key = f"{r.text} (#{n})"
        out[key] = {"id": r.rule_id, "status": r.status, "priority": r.priority,
                    "utility": utility_of(r, state, policy), "selected": r.selected, "source_case_id": r.source_case_id}
    return out


def _compare(a: dict[str, dict], b: dict[str, dict], fields: tuple[str, ...]) -> dict:
    only_a = [{"key": k, "a": a[k]} for k in a if k not in b]
    only_b = [{"key": k, "b": b[k]} for k in b if k not in a]
    changed, same = [], 0
    for k in a:
        if k in b:
            diffs = [f for f in fields if a[k].get(f) != b[k].get(f)]
            if diffs:
                changed.append({"key": k, "fields": diffs, "a": a[k], "b": b[k]})
            else:
                same += 1
    return {"summary": {"only_a": len(only_a), "only_b": len(only_b), "changed": len(changed), "same": same},
            "only_a": only_a, "only_b": only_b, "changed": changed}


def same_log(store: EventStore, run_a: str, run_b: str, events_a: int, events_b: int) -> bool:
    """Whether two runs have the same (seq, type, payload) events, i.e. the same fingerprint."""
    if events_a != events_b:
        return False
    return EventLog(store).same_events(run_a, run_b)


def diff(store: EventStore, run_a: str, run_b: str, limit: int | None = None) -> dict:
    spec_a, spec_b = require_spec(store, run_a), require_spec(store, run_b)
    sa, sb = memory_at(store, run_a), memory_at(store, run_b)
    rules = _compare(_keyed_rules(sa, spec_a.policy), _keyed_rules(sb, spec_b.policy), ("status", "utility"))
    episodes = _compare(
        {e.case_id: {"id": e.episode_id, "status": "stored", "correct": e.correct, "answer": e.answer}
         for e in sa.episodes.values()},
        {e.case_id: {"id": e.episode_id, "status": "stored", "correct": e.correct, "answer": e.answer}
         for e in sb.episodes.values()},
        ("status", "correct"))
    tools = _compare(
        {t.name: {"id": t.name, "status": t.label, "total": t.total, "helpful": t.helpful} for t in sa.tools.values()},
        {t.name: {"id": t.name, "status": t.label, "total": t.total, "helpful": t.helpful} for t in sb.tools.values()},
        ("status",))
    kinds = {"rules": rules, "episodes": episodes, "tools": tools}
    if limit:
        for body in kinds.values():
            for part in ("only_a", "only_b", "changed"):
                body[part] = body[part][:limit]

    def run_info(run_id: str, spec, state) -> dict:
        s = summarise(outcomes_of(store, run_id))
        return {"run_id": run_id, "policy": spec.policy.name, "backbone": spec.backbone, "cases": s["cases"],
                "accuracy": s["accuracy"], "events": store.last_seq(run_id) + 1,
                "rules_active": len(state.active_rules()), "episodes": len(state.episodes)}

    a_info, b_info = run_info(run_a, spec_a, sa), run_info(run_b, spec_b, sb)
    return {
        "run_a": run_a,
        "run_b": run_b,
        "summary": {k: v["summary"] for k, v in kinds.items()},
        "identical": same_log(store, run_a, run_b, a_info["events"], b_info["events"]),
        "runs": {"a": a_info, "b": b_info},
        **kinds,
    }


POINT_FIELDS = ("status", "utility", "priority", "label", "text", "selected", "helpful", "harmful", "total")
"""Fields of an item compared between two points of one run (ids are stable within a run)."""


def diff_points(store: EventStore, run_id: str, a: dict, b: dict) -> dict:
    """One run's memory at two points (each `{"as_of_case": N}` or `{"as_of_seq": S}`, or {} for the
    end): items added, gone and changed between them, every kind the run's policy keeps. Built on
    `audit items`, so it shows what that command shows at each point."""
    from grandrounds.replay.audit_items import items

    ia = items(store, run_id, a.get("as_of_case"), a.get("as_of_seq"))
    ib = items(store, run_id, b.get("as_of_case"), b.get("as_of_seq"))

    def keyed(res: dict) -> dict[str, dict]:
        return {f"{it['kind']}:{it['id']}": it for it in res["items"]}

    ka, kb = keyed(ia), keyed(ib)
    added = [kb[k] for k in kb if k not in ka]
    removed = [ka[k] for k in ka if k not in kb]
    changed = []
    for k in ka:
        if k in kb:
            fields = [f for f in POINT_FIELDS if f in ka[k] and ka[k].get(f) != kb[k].get(f)]
            if fields:
                changed.append({"kind": ka[k]["kind"], "id": ka[k]["id"], "fields": fields,
                                "a": {f: ka[k].get(f) for f in fields}, "b": {f: kb[k].get(f) for f in fields}})
    return {"run_id": run_id, "a": ia["as_of"], "b": ib["as_of"], "counts_a": ia["counts"], "counts_b": ib["counts"],
            "summary": {"added": len(added), "removed": len(removed), "changed": len(changed),
                        "same": len(ka) - len(removed) - len(changed)},
            "added": added, "removed": removed, "changed": changed}
