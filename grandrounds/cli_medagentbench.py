"""`grandrounds medagentbench`: run the official MedAgentBench tasks against the local FHIR sandbox
(or a real FHIR server with `--fhir-base`) with the scripted `sim` agent, graded by the refsol rules.

The sandbox serves the recorded patient snapshot, so task types 1, 2, 3 and 8 are graded offline;
types 4-7, 9 and 10 read lab data and are graded only with `--fhir-base` (the MedAgentBench docker
server), otherwise reported as `needs_full_server`.
"""

from __future__ import annotations

import json
from collections import defaultdict

import click

from grandrounds.errors import fail


@click.command("medagentbench")
@click.argument("tasks", type=click.Path(dir_okay=False))
@click.option("--funcs", required=True, type=click.Path(dir_okay=False), help="funcs_v1.json (FHIR function specs).")
@click.option("--patients", type=click.Path(dir_okay=False), default=None,
              help="patients_from_snapshot.json for the local sandbox (needed unless --fhir-base).")
@click.option("--fhir-base", default=None, metavar="URL",
              help="A real MedAgentBench FHIR server, e.g. http://localhost:8080/fhir/ (grades every task type).")
@click.option("--task-type", "task_types", multiple=True, type=click.IntRange(1, 10), help="Only these types.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N tasks (after filtering).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def medagentbench(tasks, funcs, patients, fhir_base, task_types, limit, as_json):
    """Run MedAgentBench TASKS (test_data_v2.json) with the sim agent and grade them."""
    from handlers.agent.fhir_react import sim_fhir_agent
    from handlers.environments.fhir_sandbox import FhirSandbox
    from handlers.environments.medagentbench import FhirTools, NeedsFullServer, grade, load_functions, load_tasks

    if fhir_base is None and patients is None:
        fail("give --patients (local sandbox) or --fhir-base URL", 2, as_json)
    try:
        cases = load_tasks(tasks, tuple(task_types) or None, limit)
        functions = load_functions(funcs)
        sandbox = None if fhir_base else FhirSandbox.from_file(patients).start()
    except FileNotFoundError as exc:
        fail(f"{exc.filename}: file not found", 2, as_json)
    except (ValueError, KeyError) as exc:
        fail(str(exc), 2, as_json)
    base = fhir_base or sandbox.base
    per_type: dict[int, dict[str, int]] = defaultdict(lambda: {"tasks": 0, "correct": 0, "needs_full_server": 0})
    try:
        for case in cases:
            row = per_type[case.task_type]
            row["tasks"] += 1
            tools = FhirTools(functions, base, send_posts=sandbox is not None)
            sim_fhir_agent(case.view(), tools)
            try:
                row["correct"] += grade(case, tools.trajectory, base, full_server=fhir_base is not None).correct
            except NeedsFullServer:
                row["needs_full_server"] += 1
    finally:
        if sandbox is not None:
            sandbox.stop()
    graded = sum(r["tasks"] - r["needs_full_server"] for r in per_type.values())
    correct = sum(r["correct"] for r in per_type.values())
    result = {"fhir_base": fhir_base or "sandbox", "agent": "sim", "tasks": len(cases), "graded": graded,
              "correct": correct, "accuracy": round(correct / graded, 4) if graded else None,
              "per_task_type": {str(k): v for k, v in sorted(per_type.items())}}
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"{correct}/{graded} graded tasks correct ({result['fhir_base']}); "
                   + ", ".join(f"task{k}: {v['correct']}/{v['tasks'] - v['needs_full_server']}"
                               + (f" (+{v['needs_full_server']} need --fhir-base)" if v["needs_full_server"] else "")
                               for k, v in sorted(per_type.items())))
