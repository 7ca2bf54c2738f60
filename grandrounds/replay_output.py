"""Human-readable rendering of replay, verify, audit and export results."""

from __future__ import annotations

import click

from grandrounds.output import _curve_points
from grandrounds.replay.audit_common import short
from grandrounds.replay.audit_history import describe
from grandrounds.replay.plot import SIM_CAPTION


def render_replay(res: dict, db: str) -> str:
    head = (f"replay of {res['source']} ({res['cases']} cases) · policy {res['policy']} · backbone {res['backbone']}"
            f" · seed {res['seed']} · {res['permutations']} permutations · "
            + (f"Kafka workers at {res['broker']}" if res.get("broker") else f"{res['workers']} worker(s)")
            + f" · db {db}")
    lines = [click.style(head, bold=True)]
    if res.get("counterfactual"):
        lines.append(f"  counterfactual configuration {res['tag']}")
    width = max(len(r["run_id"]) for r in res["runs"])
    lines.append(f"  {'run':<{width}}  {'order_seed':>10}  {'accuracy':>8}  fingerprint")
    calls = "llm_calls" in res
    for r in res["runs"]:
        seed = "-" if r["order_seed"] is None else str(r["order_seed"])
        reused = "  (already in db)" if r["reused"] else ""
        served = f"  model calls {r['llm_calls']['recorded']} recorded / {r['llm_calls']['live']} live" if calls else ""
        lines.append(f"  {r['run_id']:<{width}}  {seed:>10}  {r['accuracy']:>8.4f}  {r['fingerprint'][:16]}…"
                     f"{served}{reused}")
    lines.append(f"  accuracy   mean {res['accuracy_mean']:.4f}  σ {res['accuracy_std']:.4f}  "
                 f"min {res['accuracy_min']:.4f}  max {res['accuracy_max']:.4f}   (source order {res['source_accuracy']:.4f})")
    ci = res.get("accuracy_ci95")
    if ci:
        lines.append(f"  95% interval of the mean (bootstrap over the {len(res['runs'])} orders, seed {res['seed']}): "
                     f"{ci[0]:.4f} – {ci[1]:.4f}")
    lines.append(f"  mean curve {_curve_points(res['mean_curve'])}   (cases:accuracy so far)")
    b = res.get("baseline")
    if b:
        bci = f", 95% interval {b['accuracy_ci95'][0]:.4f} – {b['accuracy_ci95'][1]:.4f}" if b.get("accuracy_ci95") else ""
        lines.append(f"  baseline   policy {b['policy']} on the same orders: mean {b['accuracy_mean']:.4f}  "
                     f"σ {b['accuracy_std']:.4f}{bci}   (runs {b['runs'][0]['run_id']} …)")
        lines.append(f"             memory − baseline: {res['accuracy_mean'] - b['accuracy_mean']:+.4f} mean accuracy")
    if res["cases_executed"]:
        lines.append(f"  executed   {res['cases_executed']} cases in {res['seconds']:.1f} s "
                     f"({res['cases_per_second']} cases/s)")
    if calls:
        lines.append(f"  model calls {res['llm_calls']['recorded']} served from the record of {res['served_from']}, "
                     f"{res['llm_calls']['live']} live"
                     + ("" if res.get("live_fallthrough") else " (live fall-through off)"))
    for key, label in (("plot", "plot"), ("report", "report")):
        if res.get(key):
            lines.append(f"  {label:<10} {res[key]}")
    for note in res.get("notes", []):
        lines.append(f"  note: {note}")
    if res["backbone"] == "sim":
        lines.append(click.style(f"  note: {SIM_CAPTION}", fg="yellow"))
    return "\n".join(lines)


_VERDICTS = {
    "expect_mismatch": "TAMPERED (fingerprint is not the published one)",
    "expect_head_mismatch": "TAMPERED (head is not the published one)",
    "chain_broken": "TAMPERED (hash chain broken)",
    "ciphertext_tampered": "TAMPERED (sealed content fails authentication)",
    "head_mismatch": "TAMPERED (log is not the signed head)",
    "head_bad_signature": "TAMPERED (bad signature)",
    "head_other_key": "NOT VERIFIED (signed by another key)",
    "head_absent": "NOT VERIFIED (no signed head)",
    "key_missing": "KEY MISSING (content cannot be opened; nothing was erased)",
    "expect_unverifiable": "NOT VERIFIED (fingerprint cannot be computed)",
    "erased": "CONTENT ERASED (not re-executable)",
    "inconsistent": "INCONSISTENT (the log contradicts the run it declares)",
    "incomplete": "INCOMPLETE",
    "diverged": "DIVERGED",
    "code_changed": "DIVERGED (other code versions)",
}


def render_verify(res: dict) -> str:
    ok = res["ok"]
    # The verdict names the cause `reason` (replay/verify.py REASON_ORDER) gives: only an erasure record
    # reads as erased; a missing key, a ciphertext that fails authentication or a published value the log
    # no longer matches each say what they are.
    verdict = "VERIFIED (IDENTICAL)" if ok else _VERDICTS.get(res.get("reason"), "NOT VERIFIED")
    lines = [click.style(f"verify {res['run_id']}: {verdict}", bold=True, fg="green" if ok else "red")]
    lines.append(f"  recorded     {res['fingerprint']}")
    lines.append(f"  re-executed  {res['replayed_fingerprint'] or '– (not re-executed)'}"
                 + ("  (model exchanges served from the run's own record)" if res.get("replayed_from_record") else ""))
    lines.append(f"  events {res['events']} · cases {res['cases']} · {res['completeness']}")
    d = res["first_divergence"]
    if d:
        lines.append(f"  first divergence at seq {d['seq']} (case {d['case_id']}): "
                     f"recorded {d['recorded_type']} vs re-executed {d['replayed_type']}, at {d['path']}")
        lines.append(f"    recorded:    {short(str(d['recorded']), 110)}")
        lines.append(f"    re-executed: {short(str(d['replayed']), 110)}")
    if res["chain_intact"]:
        lines.append(f"  hash chain   intact (v{res['chain_version']})")
    else:
        lines.append(click.style(f"  hash chain   BROKEN at seq {res['chain_break_seq']}: an event was modified "
                                 "outside the event store API", fg="red"))
    h = res["signed_head"]
    lines.append(click.style(f"  signed head  {h['status']}: {h['detail']}",
                             fg="green" if h["status"] == "valid" else None if h["status"] == "not checked" else "red"))
    for name, label in (("expect", "expected fp "), ("expect_head", "expected head")):
        if res.get(name):
            a = res[name]
            lines.append(click.style(f"  {label} {'matches' if a['ok'] else 'DIFFERS'}: {a['expected']}",
                                     fg="green" if a["ok"] else "red"))
    for w in res.get("warnings", []):
        lines.append(click.style(f"  warning      {w}", fg="yellow"))
    for r in res.get("reasons", []):
        lines.append(click.style(f"  not verified {r}", fg="red"))
    return "\n".join(lines)


def render_items(res: dict) -> str:
    at = res["as_of"]
    where = (f"after case #{at['case_index']}" if at["case_index"] is not None
             else "at the end of the run" if at["at_head"] else f"at seq {at['seq']}")
    c = res["counts"]
    tools = f"tools {', '.join(f'{k}={v}' for k, v in c['tools'].items()) or 'none'}"
    pk = res.get("policy_kind")
    if pk:  # SkeMex, SELSM, RetroSum: their own kind, never Evo-MedAgent's rules and episodes
        counted = f"{pk}s {c[pk]}" if pk in c else f"{pk}s not listed (--kind {pk})"
        header = f"  policy {res['policy']} · {counted} · {tools}"
    else:
        header = f"  rules {c['rules_active']} active, {c['rules_retired']} retired · episodes {c['episodes']} · {tools}"
    lines = [click.style(f"memory of {res['run_id']} {where} (seq {at['seq']}, {at['cases_completed']} cases done)", bold=True),
             header]
    for it in res["items"]:
        if it["kind"] == "rule":
            u = "-" if it["utility"] is None else f"{it['utility']:.3f}"
            lines.append(f"  {it['id']}  {it['status']:<7} P{it['priority']}  utility {u}  "
                         f"used {it['selected']} (+{it['helpful']}/-{it['harmful']})  from {it['source_case_id']}  "
                         f"{short(it['text'], 70)}")
        elif it["kind"] == "episode":
            lines.append(f"  {it['id']}  stored  {'correct' if it['correct'] else 'wrong  '}  from {it['case_id']}  "
                         f"{short(it['guideline'], 80)}")
        elif it["kind"] == "skill":
            lines.append(f"  {it['id']}  {it['status']:<10} {it['branch']:<7} utility {it['utility']:.3f}  "
                         f"used {it['usage']} (+{it['successes']}/-{it['failures']})  {short(it['text'], 70)}")
        elif it["kind"] == "selsm-record":
            lines.append(f"  {it['id']}  from {it['source_case_id']}  {len(it['transitions'])} transition(s)  "
                         f"{short(it['query'], 70)}")
        elif it["kind"] == "experience":
            lesson = it["actor_lessons"][0] if it["actor_lessons"] else "-"
            lines.append(f"  {it['id']}  from {it['source_case_id']}  {len(it['actor_lessons'])} actor / "
                         f"{len(it['summariser_lessons'])} summariser lessons  {short(lesson, 70)}")
        else:
            lines.append(f"  tool {it['id']}  {it['label']}  n={it['total']} +{it['helpful']} -{it['harmful']} misuse {it['misuse']}")
    if len(res["items"]) < res["total"]:
        lines.append(f"  … {res['total'] - len(res['items'])} more (--limit 0 shows all)")
    return "\n".join(lines)


def render_history(res: dict) -> str:
    s = res["summary"]
    lines = [click.style(f"history of {res['kind']} {res['item']} in {res['run_id']}", bold=True)]
    if res["kind"] == "tool":
        lines.append(f"  calls {s['calls']} · label now {s['label_now']} · outcomes {s['outcomes']}")
    else:
        lines.append(f"  created by case {s['created_by_case']} (#{s['created_at_case_index']}) · retrieved {s['retrieved']}"
                     f" · followed {s['followed']} ({s['followed_correct']} correct) · status {s['status']}"
                     + (f" · utility now {s['utility_now']:.3f}" if s.get("utility_now") is not None else ""))
    for e in res["events"]:
        lines.append(f"  seq {e['seq']:>6}  {describe(e)}")
    if res["utility"]:
        pts = res["utility"]
        step = max(1, len(pts) // 8)
        lines.append("  utility over time: " + "  ".join(f"#{p['case_index']}:{p['utility']:.3f}" for p in pts[::step]))
    return "\n".join(lines)


def render_explain(res: dict) -> str:
    case = res["case"]
    lines = [click.style(f"case {res['case_id']} (#{res['case_index']}) in {res['run_id']}", bold=True),
             f"  category {case.get('category')} · memory version seq {res['memory_seq']}",
             f"  question  {short(case.get('question', ''), 200)}"]
    for k, v in sorted(case.get("options", {}).items()):
        lines.append(f"    {k}) {short(v, 100)}")
    lines.append(click.style("  retrieved", bold=True))
    for r in res["retrieved"]["rules"]:
        lines.append(f"    rule {r['rule_id']} rank {r['rank']} P{r['priority']} relevance {r['relevance']:.3f} "
                     f"utility {r['utility']:.3f} score {r['score']:.3f}  from case {r.get('from_case_id')} "
                     f"(#{r.get('from_case_index')}): {short(r['text'], 70)}")
    for e in res["retrieved"]["episodes"]:
        lines.append(f"    episode {e['episode_id']} rank {e['rank']} relevance {e['relevance']:.3f} from case "
                     f"{e['source_case_id']} (#{e.get('from_case_index')}): {short(e['guideline'], 70)}")
    for g in res["retrieved"]["tool_guidance"]:
        lines.append(f"    tool {g['tool']}: {g['label']}")
    if not (res["retrieved"]["rules"] or res["retrieved"]["episodes"]):
        lines.append("    nothing")
    lines.append(click.style("  injected context", bold=True))
    lines += [f"    | {line}" for line in res["injected_prefix"].splitlines()]
    lines.append(click.style("  agent steps", bold=True))
    lines += [f"    {s['kind']}: {short(s['content'], 110)}" for s in res["steps"]]
    f = res["followed"]
    if f and f["kind"] in ("rule", "episode"):
        lines.append(click.style(f"  answer {res['answer']} from {f['kind']} {f['id']}, learned from case "
                                 f"{f['from_case_id']} (#{f['from_case_index']}, reflection seq {f['reflection_seq']})", bold=True))
        if f.get("from_case_question"):
            lines.append(f"    that case: {short(f['from_case_question'], 150)}")
    elif res["answer"] is not None:
        lines.append(click.style(f"  answer {res['answer']} ({res['answer_source']})", bold=True))
    if res["failed"]:
        lines.append(click.style(f"  case failed in {res['failed']['stage']}: {res['failed']['reason']}", fg="red"))
    fb = res["feedback"]
    if fb:
        lines.append(f"  feedback  gold {fb['gold']} · {'CORRECT' if fb['correct'] else 'WRONG'}"
                     + "".join(f" · {o['rule_id']} {'helpful' if o['helpful'] else 'harmful'}" for o in fb["rule_outcomes"])
                     + "".join(f" · tool {o['tool']} {o['outcome']}" for o in fb["tool_outcomes"]))
    if res["reflection"]:
        lines.append(f"  reflection {short(res['reflection']['summary'], 150)}")
    lines.append(click.style("  memory changes", bold=True))
    lines += [f"    seq {c['seq']}: {c['description']}" for c in res["memory_changes"]] or ["    none"]
    return "\n".join(lines)


def render_diff(res: dict, limit: int) -> str:
    a, b = res["runs"]["a"], res["runs"]["b"]
    lines = [click.style(f"diff {res['run_a']} (a) vs {res['run_b']} (b)", bold=True),
             f"  a: {a['policy']} · {a['cases']} cases · accuracy {a['accuracy']:.4f} · {a['rules_active']} rules · {a['episodes']} episodes",
             f"  b: {b['policy']} · {b['cases']} cases · accuracy {b['accuracy']:.4f} · {b['rules_active']} rules · {b['episodes']} episodes",
             f"  {'':<9} {'only a':>7} {'only b':>7} {'changed':>8} {'same':>6}"]
    for kind, s in res["summary"].items():
        lines.append(f"  {kind:<9} {s['only_a']:>7} {s['only_b']:>7} {s['changed']:>8} {s['same']:>6}")
    for kind in ("rules", "episodes", "tools"):
        body = res[kind]
        for part, label in (("only_a", "only in a"), ("only_b", "only in b"), ("changed", "changed")):
            rows = body[part][:limit] if limit else body[part]
            if not rows:
                continue
            lines.append(click.style(f"  {kind} {label}", bold=True))
            for r in rows:
                if part == "changed":
                    detail = ", ".join(f"{f} {r['a'].get(f)} → {r['b'].get(f)}" for f in r["fields"])
                    lines.append(f"    {short(r['key'], 70)}  [{r['a']['id']} / {r['b']['id']}]  {detail}")
                else:
                    item = r.get("a") or r.get("b")
                    lines.append(f"    {short(r['key'], 70)}  [{item['id']}] {item.get('status')}")
            if limit and len(body[part]) > limit:
                lines.append(f"    … {len(body[part]) - limit} more (--limit 0 shows all)")
    return "\n".join(lines)


def render_export(res: dict) -> str:
    return (f"exported {res['events']} events of {', '.join(res['runs'])} to {res['path']} ({res['format']})\n"
            + "\n".join(f"  {rid}  fingerprint {fp}" for rid, fp in res["fingerprints"].items()))
