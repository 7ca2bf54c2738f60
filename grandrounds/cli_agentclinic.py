"""`grandrounds agentclinic`: AgentClinic OSCE diagnosis dialogues, graded by an LLM judge (or a
normalised string match when no model is configured or the judge fails).

`sim`: sim doctor, rule-based patient, string-match grading — offline; not a clinical accuracy.
`openai`: model doctor, model patient, model judge through the gateway; every exchange recorded as a
run of `--db`, which `--backbone record --record-from RUN` re-executes without model calls.
"""

from __future__ import annotations

import asyncio
import json
import sys

import click

from grandrounds.cli_medagentbench import graded_run_exits, model_call_options
from grandrounds.errors import BAD_INPUT, fail

SIM_NOTE = ("sim backbone: scripted doctor (asks fixed questions, requests each recorded test group, picks the "
            "diagnosis that best overlaps the dialogue among the case's NEJM answers or, for MedQA, the file's "
            "diagnosis vocabulary), rule-based patient, "
            "string-match grading — offline plumbing, its accuracy is not a clinical measure")


@click.command("agentclinic")
@click.argument("cases_file", metavar="CASES.jsonl", type=click.Path(dir_okay=False))
@click.option("--backbone", type=click.Choice(["sim", "openai", "record"]), default="sim", show_default=True)
@click.option("--model", default=None, help="Model for the doctor, the patient and the judge (openai).")
@click.option("--base-url", default=None, help="OpenAI-compatible endpoint (else OPENAI_BASE_URL; key: OPENAI_API_KEY).")
@click.option("--judge-model", default=None,
              help="A separate moderator model (AgentClinic's moderator_llm) asked the official Yes/No question; "
                   "default: the run's --model.")
@click.option("--judge-base-url", default=None, help="The judge model's endpoint (default: --base-url).")
@model_call_options
@click.option("--max-turns", default=20, show_default=True, type=click.IntRange(min=1),
              help="Doctor turns per case (AgentClinic's default is 20).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N cases.")
@click.option("--db", default=None, help="DuckDB file recording the model exchanges (openai/record; "
                                         "default agentclinic.duckdb).")
@click.option("--run-id", default=None, help="Run id for the recorded exchanges (default: derived, numbered on reruns).")
@click.option("--record-from", default=None, metavar="RUN", help="record backend: the run of --db to serve.")
@click.option("--actions", type=click.Choice(["auto", "schema", "text"]), default="auto", show_default=True,
              help="openai: how the doctor's turns are decoded. auto: probe once whether the server enforces "
                   "json_schema and decode each turn against a schema of its legal moves (question, test, diagnosis) "
                   "where it does, else AgentClinic's text. record: the recorded run's mode.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def agentclinic(cases_file, backbone, model, base_url, judge_model, judge_base_url, timeout, max_attempts, max_turns,
                limit, db, run_id, record_from, actions, as_json):
    """Run AgentClinic OSCE CASES.jsonl (agentclinic_medqa*.jsonl or agentclinic_nejm*.jsonl)."""
    from grandrounds.bench_models import bench_model, check_options
    from grandrounds.handlers.agent.osce_runner import run_osce_cases
    from grandrounds.handlers.llm.gateway import RetryPolicy
    from grandrounds.replay.task_metrics import osce_metrics
    from grandrounds.handlers.environments.agentclinic_osce import diagnosis_vocabulary, load_osce_cases
    from grandrounds.store.canonical import content_hash

    try:
        check_options(backbone, model, record_from)
        cases = load_osce_cases(cases_file, limit)
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    db = db or ("agentclinic.duckdb" if backbone != "sim" else None)
    default_id = "osce-" + content_hash({"file": [c.case_id for c in cases], "model": model,
                                        "turns": max_turns})[:12]
    # The sim doctor's label space is the whole file's diagnoses (before --limit), so limiting
    # the run does not shrink the differential it chooses from.
    differential = diagnosis_vocabulary(load_osce_cases(cases_file)) if backbone == "sim" else None
    bar = None
    try:
        with graded_run_exits(as_json), bench_model(backbone, model, base_url, db, run_id, default_id, record_from,
                                                     timeout=timeout, retry=RetryPolicy(max_attempts=max_attempts)) as bm:
            from tqdm import tqdm

            bar = tqdm(total=len(cases), unit="case", desc="cases", file=sys.stderr, disable=as_json or None,
                       leave=False)

            judge_gw = _judge_gateway(bm, judge_model, judge_base_url, timeout)
            decoding = _doctor_actions(bm, actions, model, base_url, timeout, db, record_from)

            async def go():
                try:
                    return await run_osce_cases(cases, max_turns, bm.gateway, bm.log, differential,
                                                on_case=lambda r: bar.update(1), judge_gateway=judge_gw,
                                                actions=decoding["mode"] if decoding else "text")
                finally:
                    for gw in {id(g): g for g in (bm.gateway, judge_gw) if g is not None}.values():
                        await gw.aclose()

            results = asyncio.run(go())
            llm = bm.log.summary() if bm.log else None
            note = bm.note or SIM_NOTE
    finally:
        if bar is not None:
            bar.close()
    correct = sum(r.correct for r in results)
    out = {"cases_file": cases_file, "backbone": backbone, "model": model if backbone != "sim" else None,
           "cases": len(results), "correct": correct, "accuracy": round(correct / len(results), 4),
           "max_turns": max_turns, "metrics": osce_metrics(results, with_tokens=llm is not None),
           "results": [r.as_dict() for r in results], "notes": [note]}
    if llm is not None:
        out["llm"] = llm
        out["db"] = db
        out["actions"] = decoding
    if as_json:
        click.echo(json.dumps(out))
        return
    m = out["metrics"]
    click.echo(click.style(f"agentclinic {cases_file}", bold=True) + f"  backbone {backbone}"
               + (f" · model {model}" if out["model"] else ""))
    click.echo(f"  cases {len(results)}   correct {correct}   accuracy {out['accuracy']:.3f}   "
               f"diagnosed {m['tc']:.1f}%   avg turns {m['avg_turns']}   avg tests {m['avg_tests']}")
    if llm is not None:
        click.echo(f"  llm calls {llm['calls']} · tokens per correct case {m['tokens_per_correct_task']} · "
                   f"judged by llm {m['judged_by_llm']}, by string match {m['judged_by_string_match']} · "
                   f"run {llm['run_id']} in {db}")
    for r in results:
        mark = click.style("✓", fg="green") if r.correct else click.style("✗", fg="red")
        click.echo(f"  {mark} {r.case_id}: {r.diagnosis or '(' + r.status + ')'}  — gold: {r.correct_diagnosis}"
                   f"  [{r.judge}, {r.turns} turns]")
    click.echo(click.style(f"  note: {note}", fg="yellow"))


def _judge_gateway(bm, judge_model: str | None, judge_base_url: str | None, timeout: float):
    """The moderator's gateway: a separate model when `--judge-model` names one (its exchanges are
    recorded in the same run, stage `judge`; a record re-execution serves them like the others),
    else None (the run's own model judges)."""
    if judge_base_url and not judge_model:
        raise click.UsageError("--judge-base-url needs --judge-model")
    if bm.gateway is None or not judge_model:
        return None
    from grandrounds.handlers.backbones.build import live_transport
    from grandrounds.handlers.llm.gateway import LLMGateway

    transport = bm.gateway.transport if bm.backbone == "record" else live_transport(judge_base_url, None, timeout)
    return LLMGateway(transport, judge_model, params={"temperature": 0.0}, retry=bm.gateway.retry)


def _doctor_actions(bm, requested: str, model: str | None, base_url: str | None, timeout: float, db: str | None,
                    record_from: str | None) -> dict[str, str] | None:
    """How the doctor's turns are decoded: None for sim; a record re-execution takes the recorded run's mode
    (schema when its doctor turns carried the DoctorTurn schema), never probing; a live run settles
    `--actions` as `grandrounds run` does (`auto` probes the server once)."""
    if bm.gateway is None:
        return None
    if bm.backbone == "record":
        from grandrounds.handlers.agent.actions import DOCTOR_SCHEMA_NAME
        from grandrounds.handlers.llm.record import RecordedExchanges

        recorded = RecordedExchanges.from_store(bm.log.store, record_from)
        schema = any(((x.params.get("response_format") or {}).get("json_schema") or {}).get("name")
                     == DOCTOR_SCHEMA_NAME for q in recorded.by_hash.values() for x in q)
        return {"mode": "schema" if schema else "text", "json_schema": "recorded"}
    from grandrounds.backbone_choice import choose_actions

    return choose_actions(requested, model, base_url, timeout)
