"""`grandrounds medagentbench`: run the official MedAgentBench tasks against the local FHIR sandbox
(or a real FHIR server with `--fhir-base`), graded by the refsol rules.

Agents: the scripted `sim` agent (offline, not a model), or a model (`--backbone openai`) speaking the
official text protocol (GET url / POST url + JSON / FINISH([...])) through the gateway, every exchange
recorded as a run of `--db`; `--backbone record --record-from RUN` re-executes such a run without
model calls. The sandbox serves the recorded patient snapshot, so task types 1, 2, 3 and 8 are graded
offline; types 4-7, 9 and 10 read lab data and are graded only with `--fhir-base` (the MedAgentBench
docker server), otherwise reported as `needs_full_server`.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from contextlib import contextmanager

import click

from grandrounds.errors import BAD_INPUT, fail

OFFICIAL_BASE = "http://localhost:8080/fhir/"
"""The official harness's default api_base: what a model is shown when the sandbox serves (see FhirTools)."""
SIM_NOTE = "sim agent: scripted for the official task templates, not a model; its accuracy is not a clinical measure"


def model_call_options(f):
    """`--timeout` and `--max-attempts`: how long one model request may take and how often it is tried,
    said the same way by every command that calls a model (`run`, `medagentbench`, `agentclinic`)."""
    f = click.option("--max-attempts", default=5, show_default=True, type=click.IntRange(min=1),
                     help="Attempts per model call on transport failures (backoff with jitter) before the run stops "
                          "as an outage.")(f)
    return click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(min=1),
                        help="Seconds per model request attempt (openai); generous for slow local servers.")(f)


@contextmanager
def graded_run_exits(as_json: bool):
    """The exits of a benchmark run through `bench_model` (medagentbench, agentclinic): bad input 2; a
    record that cannot serve a request, or the store failing, 1; a model outage 1, named as what it is:
    transport failures are not results, so nothing was graded."""
    from grandrounds.handlers.llm.errors import ModelOutage, ReplayDivergence
    from grandrounds.store.eventstore import StoreError

    try:
        yield
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    except (ReplayDivergence, StoreError) as exc:
        fail(str(exc), 1, as_json)
    except ModelOutage as exc:
        fail(f"{exc} (connection or server errors, not model answers; the tasks were not graded)", 1, as_json)


@click.command("medagentbench")
@click.argument("tasks", type=click.Path(dir_okay=False))
@click.option("--funcs", required=True, type=click.Path(dir_okay=False), help="funcs_v1.json (FHIR function specs).")
@click.option("--patients", type=click.Path(dir_okay=False), default=None,
              help="patients_from_snapshot.json for the local sandbox (needed unless --fhir-base).")
@click.option("--fhir-base", default=None, metavar="URL",
              help="A real MedAgentBench FHIR server, e.g. http://localhost:8080/fhir/ (grades every task type).")
@click.option("--task-type", "task_types", multiple=True, type=click.IntRange(1, 10), help="Only these types.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N tasks (after filtering).")
@click.option("--backbone", type=click.Choice(["sim", "openai", "record"]), default="sim", show_default=True)
@click.option("--model", default=None, help="Model name (openai).")
@click.option("--base-url", default=None, help="OpenAI-compatible endpoint (else OPENAI_BASE_URL; key: OPENAI_API_KEY).")
@model_call_options
@click.option("--max-rounds", default=8, show_default=True, type=click.IntRange(min=1),
              help="Model replies per task (openai/record).")
@click.option("--db", default=None, help="DuckDB file recording the exchanges (openai/record; default medagentbench.duckdb).")
@click.option("--run-id", default=None, help="Run id for the recorded exchanges (default: derived, numbered on reruns).")
@click.option("--record-from", default=None, metavar="RUN", help="record backend: the run of --db to serve.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def medagentbench(tasks, funcs, patients, fhir_base, task_types, limit, backbone, model, base_url, timeout, max_attempts, max_rounds, db,
                  run_id, record_from, as_json):
    """Run MedAgentBench TASKS (test_data_v2.json) with the sim agent or a model and grade them."""
    from grandrounds.bench_models import bench_model, check_options
    from grandrounds.handlers.llm.gateway import RetryPolicy
    from grandrounds.sandbox.fhir_server import FhirSandbox
    from grandrounds.handlers.environments.medagentbench import load_functions, load_tasks
    from grandrounds.store.canonical import content_hash

    if fhir_base is None and patients is None:
        fail("give --patients (local sandbox) or --fhir-base URL", 2, as_json)
    try:
        check_options(backbone, model, record_from)
        cases = load_tasks(tasks, tuple(task_types) or None, limit)
        functions = load_functions(funcs)
        with open(funcs, encoding="utf-8") as f:
            functions_json = json.dumps(json.load(f))  # as the official harness shows them
        sandbox = None if fhir_base else FhirSandbox.from_file(patients).start()
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    except FileNotFoundError as exc:
        fail(f"{exc.filename}: file not found", 2, as_json)
    except (ValueError, KeyError) as exc:
        fail(str(exc), 2, as_json)
    base = fhir_base or sandbox.base
    db = db or ("medagentbench.duckdb" if backbone != "sim" else None)
    default_id = "mab-" + content_hash({"tasks": [c.case_id for c in cases], "model": model,
                                       "rounds": max_rounds})[:12]
    try:
        with graded_run_exits(as_json), bench_model(backbone, model, base_url, db, run_id, default_id, record_from,
                                                     timeout=timeout, retry=RetryPolicy(max_attempts=max_attempts)) as bm:
            rows = asyncio.run(_run_all(cases, functions, functions_json, base, fhir_base, bm, max_rounds))
            llm = bm.log.summary() if bm.log else None
            note = bm.note or SIM_NOTE
    finally:
        if sandbox is not None:
            sandbox.stop()
    result = _summary(rows, fhir_base, backbone, model, llm, note)
    if llm is not None:
        result["db"] = db
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"{result['correct']}/{result['graded']} graded tasks correct ({result['fhir_base']}, "
                   f"agent {result['agent']}); "
                   + ", ".join(f"task{k}: {v['correct']}/{v['tasks'] - v['needs_full_server']}"
                               + (f" (+{v['needs_full_server']} need --fhir-base)" if v["needs_full_server"] else "")
                               for k, v in result["per_task_type"].items()))
        if llm is not None:
            click.echo(f"llm calls {llm['calls']} · tokens per correct task "
                       f"{result['metrics']['tokens_per_correct_task']} · run {llm['run_id']} in {db}")
        click.echo(click.style(f"note: {note}", fg="yellow"))


async def _run_all(cases, functions, functions_json, base, fhir_base, bm, max_rounds) -> list[dict]:
    from grandrounds.handlers.agent.fhir_official import run_official_fhir_agent
    from grandrounds.handlers.agent.fhir_react import sim_fhir_agent
    from grandrounds.handlers.environments.medagentbench import FhirTools, Grade, NeedsFullServer, grade, reference
    from grandrounds.handlers.environments.medagentbench.client import FhirClient, FhirTransportError
    from grandrounds.handlers.environments.medagentbench.tasks import needs_full_server

    public = fhir_base or OFFICIAL_BASE
    client = FhirClient()
    rows = []
    try:
        for case in cases:  # strictly in order, so a recorded run replays in the same order
            tools = FhirTools(functions, base, public_base=public, client=client)
            if bm.gateway is None:
                await sim_fhir_agent(case.view(), tools)
                status, rounds = "completed", None
            else:
                run = await run_official_fhir_agent(bm.gateway, case.view(), tools,
                                                    bm.log.recorder(case.case_id, "act"), functions_json, max_rounds)
                status, rounds = run.status, run.rounds
            row = {"case_id": case.case_id, "task_type": case.task_type, "status": status, "rounds": rounds,
                   "calls": len(tools.trajectory.calls), "answer": tools.trajectory.result,
                   "tokens": bm.log.case_tokens(case.case_id) if bm.log else 0}
            if needs_full_server(case) and fhir_base is None:
                row.update(correct=None, reason="needs_full_server", graded=False, t_min=None)
            else:
                try:
                    data = await reference(case, base, client)
                    g = grade(case, tools.trajectory, public, data, full_server=fhir_base is not None)
                except (FhirTransportError, ValueError) as exc:  # refsol fails on it: incorrect
                    g = Grade(False, f"reference data unavailable: {exc}")
                except NeedsFullServer:  # pragma: no cover - checked above
                    raise
                row.update(correct=g.correct, reason=g.reason, graded=g.graded, t_min=g.min_rounds)
            rows.append(row)
    finally:
        if bm.gateway is not None:
            await bm.gateway.aclose()
    return rows


def _summary(rows, fhir_base, backbone, model, llm, note) -> dict:
    """Counts from one verdict per task (`correct`), so per-type and top-level numbers agree. As the
    official `calculate_overall`: a task without a FINISH result is not graded and counts as incorrect;
    the success rate is correct / tasks (here over the task types this server can grade)."""
    from grandrounds.handlers.environments.medagentbench import ACTION_TASK_TYPES
    from grandrounds.replay.task_metrics import TaskRecord, er, osr, qab, sr, tc, tokens_per_correct

    per_type: dict[int, dict[str, int]] = defaultdict(
        lambda: {"tasks": 0, "correct": 0, "no_result": 0, "needs_full_server": 0})
    records = []
    for r in rows:
        t = per_type[r["task_type"]]
        t["tasks"] += 1
        if r["correct"] is None:
            t["needs_full_server"] += 1
            continue
        t["correct"] += bool(r["correct"])
        t["no_result"] += not r["graded"]
        records.append(TaskRecord(
            case_id=r["case_id"], task_class="action" if r["task_type"] in ACTION_TASK_TYPES else "query",
            completed=r["status"] == "completed", success=bool(r["correct"]),
            turns=r["rounds"] or 0, tool_calls=r["calls"], timeout=r["status"] == "limit_reached",
            invalid=r["status"] == "invalid_action", fallback=False, tokens=r["tokens"],
            act_tokens=r["tokens"], error=r["status"] == "error", t_min=r["t_min"]))
    graded = len(records)
    correct = sum(r.success for r in records)
    q, a = sr(records, "query"), sr(records, "action")
    metrics = {"tc": tc(records), "sr": sr(records), "q_sr": q, "a_sr": a, "qab": qab(q, a), "er": er(records),
               # T_min per task: the reference solution's rounds (its reads, required POSTs, then FINISH)
               "osr": osr(records) if llm is not None else None, "t_min": "per task (refsol branch)",
               "terminations": {k: sum(r["status"] == k for r in rows if r["correct"] is not None)
                                for k in ("completed", "invalid_action", "limit_reached", "error")},
               "tokens_per_correct_task": tokens_per_correct(records) if llm is not None else None,
               "avg_rounds": round(sum(r.turns for r in records) / graded, 3) if graded and llm is not None else None,
               "avg_fhir_calls": round(sum(r.tool_calls for r in records) / graded, 3) if graded else None}
    out = {"fhir_base": fhir_base or "sandbox", "agent": backbone, "model": model if backbone != "sim" else None,
           "tasks": len(rows), "graded": graded, "correct": correct,
           "no_result": sum(not r["graded"] for r in rows if r["correct"] is not None),
           "accuracy": round(correct / graded, 4) if graded else None,
           "per_task_type": {str(k): v for k, v in sorted(per_type.items())}, "metrics": metrics,
           "results": rows, "notes": [note]}
    if llm is not None:
        out["llm"] = llm
    return out
