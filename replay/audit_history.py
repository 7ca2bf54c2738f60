"""`audit history`: every event that touched one memory item, in order, with utility over time.

For a rule: which case and reflection created it, each patch, each priority change (a
near-duplicate proposal escalating it is a merge; a demotion or retirement is its
deprecation), every case that retrieved it with the rank and scores it had then, whether the
agent followed it, the case's outcome, and its utility after each feedback. For an episode:
its creation and every retrieval and use. For a tool: label changes and every call.
"""

from __future__ import annotations

import bisect
import json
from typing import Callable

from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.policies.evo_medagent.policy import rule_utility
from grandrounds.replay.audit_common import AuditInputError, case_indexes, short
from grandrounds.replay.caselog import require_spec
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog
from grandrounds.handlers.policies.evo_medagent.memory import Rule

RULE_TYPES = ("rule.added", "rule.edited", "rule.priority_changed", "rule.retired")


Row = tuple[int, str, "str | None", "int | None", dict]


def _rows(store: EventStore, run_id: str, typed: dict[str, Callable[[dict], bool]],
          text_types: tuple[str, ...] = (), needle: str | None = None) -> list[Row]:
    """(seq, type, case_id, causation_seq, payload) in seq order: events of the `typed` types whose payload
    passes its test, and events of `text_types` whose stored payload contains `needle`."""
    log = EventLog(store)
    found = {e.seq: e for e in log.events(run_id, types=list(typed)) if typed[e.type](e.payload)} if typed else {}
    if text_types:
        found.update((e.seq, e) for e in log.events(run_id, types=list(text_types), text=needle))
    return [(e.seq, e.type, e.case_id, e.causation_seq, e.payload) for _, e in sorted(found.items())]


def _has(store: EventStore, run_id: str, type_: str, field: str, value: str) -> bool:
    return any(e.payload.get(field) == value for e in EventLog(store).events(run_id, types=[type_]))


def item_kind(store: EventStore, run_id: str, item: str) -> str:
    if _has(store, run_id, "rule.added", "rule_id", item):
        return "rule"
    if _has(store, run_id, "episode.stored", "episode_id", item):
        return "episode"
    if _has(store, run_id, "skill.drafted", "skill_id", item):
        return "skill"
    started = store.read(run_id, upto_seq=0)
    tools = started[0].payload.get("tools", {}) if started else {}
    if item in tools or _has(store, run_id, "tool.label_changed", "tool", item):
        return "tool"
    raise AuditInputError(f"run {run_id!r} has no memory item {item!r} "
                          "(a rule id like rule-00012, an episode id like ep-00003, a skill id like t000004, "
                          "or a tool name)")


def history(store: EventStore, run_id: str, item: str) -> dict:
    spec = require_spec(store, run_id)
    kind = item_kind(store, run_id, item)
    indexes = case_indexes(store, run_id)
    if kind == "rule":
        body = _rule_history(store, run_id, item, spec.policy, indexes)
    elif kind == "episode":
        body = _episode_history(store, run_id, item, indexes)
    elif kind == "skill":
        body = _skill_history(store, run_id, item, indexes)
    else:
        body = _tool_history(store, run_id, item, indexes)
    return {"run_id": run_id, "item": item, "kind": kind, **body}


def _outcomes_by_case(store: EventStore, run_id: str, case_ids: list[str]) -> dict[str, dict]:
    """answer.given and feedback.recorded of the given cases, by case id."""
    if not case_ids:
        return {}
    out: dict[str, dict] = {}
    for e in EventLog(store).events(run_id, types=["answer.given", "feedback.recorded"], case_ids=case_ids):
        out.setdefault(e.case_id, {})[e.type] = e.payload
    return out


def _use_entry(seq: int, cid: str, indexes: dict, rank: int, scores: dict, ref: str, outcome: dict) -> dict:
    answer = outcome.get("answer.given", {})
    fb = outcome.get("feedback.recorded", {})
    return {
        "seq": seq, "event": "retrieved", "case_id": cid, "case_index": indexes.get(cid), "rank": rank, **scores,
        "followed": answer.get("source") == ref, "answer": answer.get("answer"), "answer_source": answer.get("source"),
        "gold": fb.get("gold"), "correct": fb.get("correct"),
    }


def _summary_of_uses(events: list[dict], created_by: str = "case_id", created_index: str = "case_index") -> dict:
    """The head of a rule's, an episode's or a skill's summary: the case that created it (`created_by` /
    `created_index`: the fields of its `created` entry naming that case) and how often it was retrieved,
    followed, and followed on a case answered correctly."""
    uses = [e for e in events if e["event"] == "retrieved"]
    created = next((e for e in events if e["event"] == "created"), None)
    return {"created_by_case": created[created_by] if created else None,
            "created_at_case_index": created[created_index] if created else None,
            "retrieved": len(uses), "followed": sum(e["followed"] for e in uses),
            "followed_correct": sum(1 for e in uses if e["followed"] and e["correct"])}


def _rule_history(store: EventStore, run_id: str, rule_id: str, policy, indexes: dict) -> dict:
    needle = f'"rule_id":{json.dumps(rule_id)}'
    rows = _rows(store, run_id, {t: (lambda p: p.get("rule_id") == rule_id) for t in RULE_TYPES},
                 ("memory.retrieved", "feedback.recorded"), needle)
    log = EventLog(store)
    feedback_seqs = [e.seq for e in log.events(run_id, types=["feedback.recorded"])]
    retrieved_cases = [cid for _, t, cid, _, _ in rows if t == "memory.retrieved"]
    outcomes = _outcomes_by_case(store, run_id, retrieved_cases)
    causes = [c for _, t, _, c, _ in rows if t in RULE_TYPES and c is not None]
    reflections = {e.seq: e.payload for e in log.events(run_id, seqs=causes)} if causes else {}

    ref = f"rule:{rule_id}"
    rule: Rule | None = None
    events, utility = [], []
    for seq, type_, cid, cause, p in rows:
        base = {"seq": seq, "case_id": cid, "case_index": indexes.get(cid)}
        if type_ == "rule.added":
            rule = Rule(rule_id, p["text"], list(p["trigger"]), p["priority"], p["source_case_id"], seq)
            refl = reflections.get(cause, {})
            edit = next((e for e in refl.get("edits", []) if e.get("op") == "add" and e.get("text") == p["text"]), {})
            events.append({**base, "event": "created", "text": p["text"], "trigger": p["trigger"],
                           "priority": p["priority"], "reflection_seq": cause,
                           "reflection_summary": refl.get("summary"), "reason": edit.get("reason")})
        elif type_ == "rule.edited":
            events.append({**base, "event": "patched", "old_text": rule.text if rule else None, "text": p["text"],
                           "reason": p.get("reason", ""), "reflection_seq": cause})
            if rule:
                rule.text = p["text"]
        elif type_ == "rule.priority_changed":
            merged = p.get("reason", "").startswith("near-duplicate")
            kind = "merged" if merged else ("demoted" if p["new"] > p["old"] else "escalated")
            events.append({**base, "event": kind, "old_priority": p["old"], "priority": p["new"],
                           "reason": p.get("reason", ""), "reflection_seq": cause})
        elif type_ == "rule.retired":
            events.append({**base, "event": "retired", "reason": p.get("reason", ""), "reflection_seq": cause})
        elif type_ == "memory.retrieved":
            for rank, r in enumerate(p.get("rules", []), start=1):
                if r["rule_id"] == rule_id:
                    scores = {"relevance": r["relevance"], "utility": r["utility"], "score": r["score"],
                              "priority": r["priority"]}
                    events.append(_use_entry(seq, cid, indexes, rank, scores, ref, outcomes.get(cid, {})))
        elif type_ == "feedback.recorded":
            for o in p.get("rule_outcomes", []):
                if o["rule_id"] == rule_id and rule is not None:
                    rule.selected += 1
                    rule.helpful += int(o["helpful"])
                    rule.harmful += int(not o["helpful"])
                    events.append({**base, "event": "feedback", "helpful": o["helpful"], "correct": p["correct"]})
                    if isinstance(policy, EvoMedAgentPolicy):
                        n = bisect.bisect_right(feedback_seqs, seq)
                        utility.append({"seq": seq, "case_index": indexes.get(cid),
                                        "utility": round(rule_utility(rule, n, policy), 6),
                                        "selected": rule.selected, "helpful": rule.helpful})
    final_utility = None
    if rule is not None and isinstance(policy, EvoMedAgentPolicy):
        final_utility = round(rule_utility(rule, len(feedback_seqs), policy), 6)
    return {
        "summary": {
            **_summary_of_uses(events),
            "patches": sum(e["event"] == "patched" for e in events),
            "merges": sum(e["event"] == "merged" for e in events),
            "status": "retired" if any(e["event"] == "retired" for e in events) else "active",
            "utility_now": final_utility,
            "text_now": rule.text if rule else None,
        },
        "events": events,
        "utility": utility,
    }


def _episode_history(store: EventStore, run_id: str, episode_id: str, indexes: dict) -> dict:
    needle = f'"episode_id":{json.dumps(episode_id)}'
    ref = f"episode:{episode_id}"
    rows = _rows(store, run_id, {}, ("episode.stored", "memory.retrieved"), needle)
    outcomes = _outcomes_by_case(store, run_id, [cid for _, t, cid, _, _ in rows if t == "memory.retrieved"])
    events = []
    for seq, type_, cid, cause, p in rows:
        if type_ == "episode.stored" and p["episode_id"] == episode_id:
            events.append({"seq": seq, "event": "created", "case_id": cid, "case_index": indexes.get(cid),
                           "reflection_seq": cause, "correct": p["correct"], "answer": p["answer"], "gold": p["gold"],
                           "summary": p["summary"], "guideline": p["guideline"]})
        elif type_ == "memory.retrieved":
            for rank, e in enumerate(p.get("episodes", []), start=1):
                if e["episode_id"] == episode_id:
                    events.append(_use_entry(seq, cid, indexes, rank, {"relevance": e["relevance"]}, ref,
                                             outcomes.get(cid, {})))
    return {
        "summary": {**_summary_of_uses(events), "status": "stored"},
        "events": events,
        "utility": [],
    }


def _tool_history(store: EventStore, run_id: str, tool: str, indexes: dict) -> dict:
    needle = f'"tool":{json.dumps(tool)}'
    rows = _rows(store, run_id, {}, ("tool.label_changed", "answer.given", "feedback.recorded"), needle)
    events = []
    for seq, type_, cid, _, p in rows:
        base = {"seq": seq, "case_id": cid, "case_index": indexes.get(cid)}
        if type_ == "tool.label_changed" and p["tool"] == tool:
            events.append({**base, "event": "relabelled", "old": p["old"], "new": p["new"], "n": p["n"],
                           "helpful": p["helpful"], "harmful": p["harmful"], "misuse": p["misuse"]})
        elif type_ == "answer.given":
            for c in p.get("tool_calls", []):
                if c["tool"] == tool:
                    events.append({**base, "event": "called", "label": c["label"], "output": c["output"],
                                   "adopted": c["adopted"]})
        elif type_ == "feedback.recorded":
            for o in p.get("tool_outcomes", []):
                if o["tool"] == tool:
                    events.append({**base, "event": "outcome", "outcome": o["outcome"], "correct": p["correct"]})
    labels = [e for e in events if e["event"] == "relabelled"]
    return {
        "summary": {"calls": sum(e["event"] == "called" for e in events),
                    "label_now": labels[-1]["new"] if labels else "Caution",
                    "relabelled": len(labels),
                    "outcomes": {k: sum(1 for e in events if e.get("outcome") == k)
                                 for k in ("helpful", "harmful", "misuse", "neutral")}},
        "events": events,
        "utility": [],
    }


SKILL_TYPES = ("skill.drafted", "skill.reviewed", "skill.patched", "skill.utility_updated", "skill.matured",
               "skill.deprecated", "skill.archived")
"""SkeMex events carrying `skill_id` (merges name `kept` / `absorbed`)."""


def _skill_history(store: EventStore, run_id: str, skill_id: str, indexes: dict) -> dict:
    """A SkeMex skill: draft, review, patches, every retrieval and adoption, each once-per-window
    utility update, maturation / deprecation / merge / archiving."""
    needle = f'"item_id":{json.dumps(skill_id)}'
    typed = {t: (lambda p: p.get("skill_id") == skill_id) for t in SKILL_TYPES}
    typed["skill.merged"] = lambda p: skill_id in (p.get("kept"), p.get("absorbed"))
    rows = _rows(store, run_id, typed, ("memory.retrieved",), needle)
    outcomes = _outcomes_by_case(store, run_id, [cid for _, t, cid, _, _ in rows if t == "memory.retrieved"])
    ref = f"skill:{skill_id}"
    events, utility = [], []
    status, text, u = "draft", None, None
    for seq, type_, cid, _, p in rows:
        base = {"seq": seq, "case_id": cid, "case_index": indexes.get(cid)}
        if type_ == "skill.drafted":
            text, u = p["body"]["core_action"], p["utility"]
            src = p["source_case_id"]
            events.append({**base, "event": "created", "status": "draft", "branch": p["branch"],
                           "category": p.get("category"), "tool": p.get("tool"), "text": text,
                           "trigger": p["body"]["trigger"], "source_case_id": src,
                           "source_case_index": indexes.get(src), "utility": u})
        elif type_ == "skill.reviewed":
            if p["kind"] == "create":
                status = "active" if p["accepted"] else "archived"
                events.append({**base, "event": "activated" if p["accepted"] else "rejected",
                               "reason": p["reason"], "status": status})
            elif not p["accepted"]:
                events.append({**base, "event": "patch-rejected", "reason": p["reason"]})
        elif type_ == "skill.patched":
            events.append({**base, "event": "patched", "old_text": text, "text": p["body"]["core_action"],
                           "version": p["version"], "reason": p.get("reason", ""),
                           "source_case_id": p["source_case_id"]})
            text = p["body"]["core_action"]
        elif type_ == "skill.utility_updated":
            u = p["new"]
            entry = {**base, "event": "utility", "window": p["window"], "old": p["old"], "new": p["new"],
                     "lr": p["lr"], "mean_delta": p["mean_delta"], "adopted_pos": p["adopted_pos"],
                     "adopted_neg": p["adopted_neg"]}
            events.append(entry)
            utility.append({"seq": seq, "case_index": indexes.get(cid), "window": p["window"], "utility": p["new"]})
        elif type_ in ("skill.matured", "skill.deprecated", "skill.archived"):
            status = {"skill.matured": "mature", "skill.deprecated": "deprecated", "skill.archived": "archived"}[type_]
            events.append({**base, "event": status if status != "mature" else "matured", "window": p["window"],
                           "utility": p.get("utility"), "reason": p.get("reason", ""), "status": status})
        elif type_ == "skill.merged":
            absorbed = p["absorbed"] == skill_id
            if absorbed:
                status = "archived"
            events.append({**base, "event": "merged-into" if absorbed else "absorbed",
                           "other": p["kept"] if absorbed else p["absorbed"], "cosine": p["cosine"],
                           "window": p["window"]})
        elif type_ == "memory.retrieved":
            for rank, it in enumerate(p.get("items", []), start=1):
                if it["item_id"] == skill_id and it["kind"] == "skill":
                    scores = {"relevance": it["relevance"], "utility": it["detail"].get("utility"),
                              "score": it["score"], "strength": it["detail"].get("strength")}
                    events.append(_use_entry(seq, cid, indexes, rank, scores, ref, outcomes.get(cid, {})))
    return {
        "summary": {
            **_summary_of_uses(events, "source_case_id", "source_case_index"),  # a skill names the case it came from
            "patches": sum(e["event"] == "patched" for e in events),
            "merges": sum(e["event"] in ("absorbed", "merged-into") for e in events),
            "status": status, "utility_now": u, "text_now": text,
        },
        "events": events,
        "utility": utility,
    }


def describe(entry: dict) -> str:
    """One human line for a history entry."""
    e = entry["event"]
    where = f"case #{entry.get('case_index')} {entry.get('case_id')}"
    if e == "created" and "source_case_id" in entry:  # a SkeMex skill: distilled when a window closed
        return (f"drafted ({entry['branch']}) from case #{entry['source_case_index']} {entry['source_case_id']}, "
                f"window closed at {where}: {short(entry.get('text') or '', 90)}")
    if e == "created":
        extra = f"P{entry['priority']} " if "priority" in entry else ""
        return f"created by {where} (reflection seq {entry.get('reflection_seq')}): {extra}{short(entry.get('text') or entry.get('guideline') or '', 90)}"
    if e == "patched":
        return f"patched by {where}: {short(entry['text'], 80)} — {entry['reason']}"
    if e in ("merged", "demoted", "escalated"):
        return f"{e} by {where}: P{entry['old_priority']} → P{entry['priority']} — {short(entry['reason'], 70)}"
    if e == "retired":
        return f"retired by {where} — {entry['reason']}"
    if e == "retrieved":
        scores = " ".join(f"{k} {entry[k]:.3f}" for k in ("relevance", "utility", "score") if k in entry)
        used = "FOLLOWED" if entry["followed"] else "not followed"
        ok = {True: "correct", False: "wrong", None: "no outcome"}[entry["correct"]]
        return f"retrieved for {where} rank {entry['rank']} ({scores}); {used}; case {ok}"
    if e == "feedback":
        return f"feedback on {where}: {'helpful' if entry['helpful'] else 'harmful'}"
    if e == "relabelled":
        return f"relabelled after {where}: {entry['old']} → {entry['new']} (n={entry['n']})"
    if e == "called":
        return f"called on {where} as {entry['label']}: output {entry['output']}{' (adopted)' if entry['adopted'] else ''}"
    if e == "outcome":
        return f"outcome on {where}: {entry['outcome']}"
    if e in ("activated", "rejected", "patch-rejected"):
        return f"{e} by review during {where} — {entry['reason']}"
    if e == "utility":
        return (f"utility {entry['old']:.3f} → {entry['new']:.3f} at the end of window {entry['window']} "
                f"(adopted+ {entry['adopted_pos']}, adopted− {entry['adopted_neg']}, η {entry['lr']:.3f})")
    if e in ("matured", "deprecated", "archived"):
        why = f" — {entry['reason']}" if entry.get("reason") else ""
        return f"{e} by governance after window {entry['window']} (utility {entry.get('utility')}){why}"
    if e in ("merged-into", "absorbed"):
        return f"{e} {entry['other']} by governance after window {entry['window']} (cosine {entry['cosine']:.3f})"
    return f"{e} {where}"
