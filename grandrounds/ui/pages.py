"""What each page of the web view shows, assembled from the same functions the CLI uses
(replay/audit_*.py, replay/metrics.py, replay/report.py, replay/run_overview.py): the view adds
layout, never its own reading of the log."""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING

from grandrounds.replay.audit_common import case_indexes
from grandrounds.replay.audit_diff import diff_points
from grandrounds.replay.audit_explain import explain
from grandrounds.replay.audit_history import describe, history
from grandrounds.replay.audit_items import items
from grandrounds.replay.metrics import cumulative_accuracy, default_window, rolling_accuracy
from grandrounds.replay.report import category_accuracy, memory_growth
from grandrounds.replay.run_overview import overview, replays_of, run_row
from grandrounds.replay.stats import outcomes_of
from grandrounds.store.eventstore import EventStore
from grandrounds.ui import svg

if TYPE_CHECKING:  # the verify module is loaded on the first verify request only (it brings in re-execution)
    from grandrounds.replay.verify import VerifyResult

SIM_NOTE = "sim backbone: an offline simulator for tests and demos; its accuracy is not a clinical measure"
_REPLAY_SUFFIX = re.compile(r"-(perm\d+-s\d+|original)$")


def runs_page(store: EventStore, verified: dict[str, VerifyResult]) -> dict:
    rows = overview(store)
    for r in rows:
        v = verified.get(r["run_id"])
        r["reexecuted"] = None if v is None or v.fingerprint != r["fingerprint"] else v.ok
    return {"runs": rows, "any_sim": any(r["backbone"] == "sim" for r in rows)}


def _band(curves: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    n = min(len(c) for c in curves)
    mean = [sum(c[i] for c in curves) / len(curves) for i in range(n)]
    std = [math.sqrt(sum((c[i] - mean[i]) ** 2 for c in curves) / len(curves)) for i in range(n)]
    return mean, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)]


def _replay_groups(store: EventStore, run_id: str) -> list[dict]:
    """The run's replays, one group per configuration (plain permutations; each counterfactual)."""
    groups: dict[str, list[dict]] = {}
    for rid in replays_of(store, run_id):
        res = outcomes_of(store, rid)
        row = run_row(store, rid, chain=False)
        row["curve"] = cumulative_accuracy(res)
        groups.setdefault(_REPLAY_SUFFIX.sub("", rid), []).append(row)
    out = []
    for stem, rows in groups.items():
        accs = [r["accuracy"] for r in rows]
        mean = sum(accs) / len(accs)
        std = math.sqrt(sum((a - mean) ** 2 for a in accs) / len(accs))
        out.append({"stem": stem, "policy": rows[0]["policy"], "runs": rows, "mean": mean, "std": std,
                    "min": min(accs), "max": max(accs)})
    out.sort(key=lambda g: (g["stem"] != run_id, g["policy"] == "none", g["stem"]))  # plain orders first
    return out


def run_page(store: EventStore, run_id: str, window: int | None = None) -> dict:
    row = run_row(store, run_id)
    results = outcomes_of(store, run_id)
    w = window or default_window(len(results))
    cumulative, rolling = cumulative_accuracy(results), rolling_accuracy(results, w)
    curves = svg.Chart(f"{run_id}: accuracy over the stream", "accuracy", y_max=1.0, series=[
        svg.Series("cumulative", cumulative, color="#000", width=2.0),
        svg.Series(f"rolling ({w} cases)", rolling, color="#d62728", dash="5 3")])
    groups = _replay_groups(store, run_id)
    # `replay --baseline none` (or --policy none): the memory-free runs on the same orders, drawn
    # on every other group's chart too
    baseline = next((g for g in groups if g["policy"] == "none"), None)
    replay_charts = []
    for g in groups:
        chart = svg.Chart(f"{g['stem']}: {len(g['runs'])} orders · mean {g['mean']:.3f} ± {g['std']:.3f}",
                          "cumulative accuracy", y_max=1.0)
        if len(g["runs"]) > 1:
            mean, lo, hi = _band([r["curve"] for r in g["runs"]])
            chart.bands.append(svg.Band("mean ± 1σ", lo, hi))
        for r in g["runs"]:
            chart.series.append(svg.Series(r["run_id"].removeprefix(g["stem"] + "-"), r["curve"], width=0.9,
                                           opacity=0.6))
        if len(g["runs"]) > 1:
            chart.series.append(svg.Series("mean", mean, color="#000", width=2.2))
        if baseline is not None and g is not baseline:
            chart.series.append(svg.Series("baseline (none) mean", _band([r["curve"] for r in baseline["runs"]])[0],
                                           color="#7f7f7f", width=1.8, dash="2 2"))
        chart.series.append(svg.Series(f"{run_id} (source)", cumulative, color="#d62728", dash="5 3"))
        replay_charts.append(svg.render(chart))
    growth = memory_growth(store, run_id)
    growth_chart = None
    if any(growth["rules"]) or any(growth["episodes"]):
        growth_chart = svg.render(svg.Chart("memory growth", "items in memory", y_min=0.0, series=[
            svg.Series("active rules", growth["rules"]), svg.Series("episodes", growth["episodes"], dash="5 3")]))
    at_end = items(store, run_id, limit=1)
    return {
        "run": row, "window": w, "accuracy_chart": svg.render(curves), "replay_groups": groups,
        "replay_charts": replay_charts, "growth_chart": growth_chart, "growth_end": {
            "rules": growth["rules"][-1] if growth["rules"] else 0,
            "episodes": growth["episodes"][-1] if growth["episodes"] else 0},
        "memory_total": at_end["total"], "counts": at_end["counts"],
        "categories": category_accuracy(store, run_id), "cases": case_list(store, run_id),
        "sim": row["backbone"] == "sim",
    }


def case_list(store: EventStore, run_id: str) -> list[dict]:
    """Index, id, category, answer and outcome of each case, in stream order."""
    cases: dict[str, dict] = {}
    for e in store.iter(run_id, types=["case.received", "answer.given", "case.completed", "case.failed"]):
        if e.type == "case.received":
            cases[e.case_id] = {"index": e.payload["index"], "case_id": e.case_id,
                                "category": e.payload["case"].get("category"), "answer": None, "correct": None,
                                "source": None, "failed": False}
        elif e.case_id in cases:
            c = cases[e.case_id]
            if e.type == "answer.given":
                c["answer"], c["source"] = e.payload["answer"], e.payload["source"]
            elif e.type == "case.completed":
                c["correct"] = e.payload["correct"]
            else:
                c["failed"] = True
    return sorted(cases.values(), key=lambda c: c["index"])


def case_page(store: EventStore, run_id: str, case_ref: str) -> dict:
    res = explain(store, run_id, case_ref)
    timeline = []
    for e in store.iter(run_id, case_id=res["case_id"]):
        timeline.append({"seq": e.seq, "type": e.type, "causation_seq": e.causation_seq, "payload": e.payload,
                         "payload_json": json.dumps(e.payload, indent=2, ensure_ascii=False)})
    exchanges = [t for t in timeline if t["type"] == "llm.exchange"]
    # SkeMex / SELSM / RetroSum record their retrieval as `items` (kind, id, relevance, score, detail)
    policy_items = [it for t in timeline if t["type"] == "memory.retrieved" for it in t["payload"].get("items", [])]
    return {"x": res, "timeline": timeline, "exchanges": exchanges, "policy_items": policy_items, "n_cases": len(case_indexes(store, run_id))}


def item_page(store: EventStore, run_id: str, item: str) -> dict:
    res = history(store, run_id, item)
    for e in res["events"]:
        e["line"] = describe(e)
    chart = None
    if res["utility"]:
        pts = res["utility"]
        chart = svg.render(svg.Chart(f"utility of {item} after each feedback", "utility", x_label="feedback #",
                                     y_max=1.2, series=[svg.Series("utility", [p["utility"] for p in pts])]))
    return {"h": res, "utility_chart": chart}


def memory_page(store: EventStore, run_id: str, as_of_case: int | None, as_of_seq: int | None,
                kind: str | None, status: str | None, sort: str) -> dict:
    res = items(store, run_id, as_of_case, as_of_seq, [kind] if kind else None, status or None, sort)
    return {"m": res}


def diff_page(store: EventStore, run_id: str, a: dict, b: dict) -> dict:
    return {"d": diff_points(store, run_id, a, b)}


def tools_page(store: EventStore, run_id: str) -> dict:
    res = items(store, run_id, kinds=["tool"])
    tools = []
    for t in res["items"]:
        h = history(store, run_id, t["id"])
        for e in h["events"]:
            e["line"] = describe(e)
        tools.append({**t, "history": h})
    return {"tools": tools, "as_of": res["as_of"]}
