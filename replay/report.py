"""A self-contained HTML report of a replay: curves, the order-sensitivity table, per-category
accuracy and memory growth over the stream. Images are inlined, so the file travels alone."""

from __future__ import annotations

import base64
import html
import math

from grandrounds.replay.plot import SIM_CAPTION, atomic_write, plot_curves, plot_growth
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog


def category_accuracy(store: EventStore, run_id: str) -> dict[str, dict]:
    log = EventLog(store)
    category = {e.case_id: e.payload["case"].get("category")
                for e in log.events(run_id, types=["case.received"], meta=False)}
    tally: dict = {}
    for e in log.events(run_id, types=["case.completed"], meta=False):
        if e.case_id in category:
            cases, correct = tally.get(category[e.case_id], (0, 0))
            tally[category[e.case_id]] = (cases + 1, correct + int(bool(e.payload["correct"])))
    return {c: {"cases": n, "correct": k, "accuracy": round(k / n, 6)}
            for c, (n, k) in sorted(tally.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))}


def memory_growth(store: EventStore, run_id: str) -> dict[str, list[int]]:
    """Active rules and episodes after each completed case."""
    rules = episodes = 0
    out: dict[str, list[int]] = {"rules": [], "episodes": []}
    for e in EventLog(store).events(run_id, types=["rule.added", "rule.retired", "episode.stored", "case.completed"],
                                    meta=False):
        type_ = e.type
        if type_ == "rule.added":
            rules += 1
        elif type_ == "rule.retired":
            rules -= 1
        elif type_ == "episode.stored":
            episodes += 1
        else:
            out["rules"].append(rules)
            out["episodes"].append(episodes)
    return out


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(header: list[str], rows: list[list], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _name(r: dict) -> str:
    return f"perm {r['k']}" if r["k"] is not None else "original"


def build_report(store: EventStore, result: dict, db: str) -> str:
    runs = result["runs"]
    cats = {r["run_id"]: category_accuracy(store, r["run_id"]) for r in runs}
    all_cats = sorted({c for per in cats.values() for c in per})
    cat_rows = []
    for c in all_cats:
        accs = [cats[r["run_id"]].get(c, {}).get("accuracy") for r in runs]
        present = [a for a in accs if a is not None]
        mean = sum(present) / len(present) if present else None
        std = math.sqrt(sum((a - mean) ** 2 for a in present) / len(present)) if present else None
        n = next((cats[r["run_id"]][c]["cases"] for r in runs if c in cats[r["run_id"]]), 0)
        cells = [f"{cats[r['run_id']][c]['accuracy']:.3f} ({cats[r['run_id']][c]['correct']}/{cats[r['run_id']][c]['cases']})"
                 if c in cats[r["run_id"]] else "–" for r in runs]
        cat_rows.append([c, n] + cells
                        + [f"{mean:.3f}" if mean is not None else "–", f"{std:.3f}" if std is not None else "–"])
    growth = {_name(r): memory_growth(store, r["run_id"]) for r in runs}
    growth_rows = [[_name(r), r["run_id"], growth[_name(r)]["rules"][-1] if growth[_name(r)]["rules"] else 0,
                    growth[_name(r)]["episodes"][-1] if growth[_name(r)]["episodes"] else 0] for r in runs]
    run_rows = [[_name(r), r["run_id"], r["order_seed"] if r["order_seed"] is not None else "–", r["cases"],
                 r["correct"], f"{r['accuracy']:.4f}", r["fingerprint"][:16] + "…"] for r in runs]
    def ci(res: dict) -> str:
        c = res.get("accuracy_ci95")
        return f"{c[0]:.4f} – {c[1]:.4f}" if c else "–"

    stats_rows = [[result["policy"], f"{result['accuracy_mean']:.4f}", ci(result), f"{result['accuracy_std']:.4f}",
                   f"{result['accuracy_min']:.4f}", f"{result['accuracy_max']:.4f}",
                   f"{result['source_accuracy']:.4f}"]]
    base = result.get("baseline")
    if base:
        stats_rows.append([f"{base['policy']} (baseline, same orders)", f"{base['accuracy_mean']:.4f}", ci(base),
                           f"{base['accuracy_std']:.4f}", f"{base['accuracy_min']:.4f}", f"{base['accuracy_max']:.4f}",
                           "–"])
    note = SIM_CAPTION if result.get("backbone") == "sim" else ""
    curves_png = plot_curves(result)
    growth_png = plot_growth(growth, "memory growth over the stream (rules: solid, episodes: dashed)")
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>grandrounds replay of {e(result['source'])}</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.6em 0 1.4em}th,td{border:1px solid #ccc;padding:3px 8px;"
        "font-size:13px;text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}"
        ".note{background:#fff6d5;border:1px solid #e6d38a;padding:6px 10px}img{max-width:100%}"
        "code{background:#f3f3f3;padding:1px 4px}</style></head><body>",
        f"<h1>Replay of <code>{e(result['source'])}</code></h1>",
        f"<p>{result['cases']} cases · {result['permutations']} permutations (seed {result['seed']}) · "
        f"policy <b>{e(result['policy'])}</b> · backbone <b>{e(result['backbone'])}</b>"
        f"{' · counterfactual ' + e(str(result.get('tag'))) if result.get('counterfactual') else ''} · db <code>{e(db)}</code></p>",
    ]
    if note:
        parts.append(f"<p class='note'>{e(note)}</p>")
    parts += [
        "<h2>Order sensitivity</h2>",
        _table(["policy", "mean", "95% interval (bootstrap)", "σ (population)", "min", "max", "source order"],
               stats_rows),
        "<p style='font-size:12px;color:#666'>The interval resamples the orders' accuracies (10,000 times, seeded "
        "by the replay's seed): it describes these orders; with few of them it is rough.</p>",
        _table(["run", "run id", "order seed", "cases", "correct", "accuracy", "fingerprint"], run_rows),
        f"<h2>Cumulative and rolling accuracy{' (baseline dashed red)' if base else ''}</h2>",
        _img(curves_png, "cumulative and rolling accuracy curves"),
        "<h2>Accuracy per category</h2>",
        "<p style='font-size:12px;color:#666'>Each cell: accuracy (correct/cases) of that run in the category.</p>",
        _table(["category", "cases"] + [_name(r) for r in runs] + ["mean", "σ"], cat_rows),
        "<h2>Memory growth</h2>", _img(growth_png, "memory growth"),
        _table(["run", "run id", "active rules at end", "episodes at end"], growth_rows),
        "<p style='font-size:12px;color:#666'>Generated by <code>grandrounds replay</code>. Every number here "
        "is recomputed from the event log; <code>grandrounds verify</code> re-executes a run and checks its "
        "fingerprint.</p></body></html>",
    ]
    return "\n".join(parts)


def write_report(store: EventStore, result: dict, db: str, path: str) -> None:
    atomic_write(path, build_report(store, result, db).encode("utf-8"))
