"""The `grandrounds` command line (DESIGN §8). Every command has `--json`."""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from functools import partial

import click

from grandrounds.cli_group import main, progress as _progress
from grandrounds.cli_medagentbench import model_call_options
from grandrounds.errors import (BAD_INPUT, discard_on_bad_input, fail, fail_for, keep_written, message_of,
                               resume_hint, where_raised)
from grandrounds.output import render_run


def schema_actions_apply(env: str, fhir_protocol: str | None, actions: str) -> bool:
    """Whether `--actions` decides this run's turns: MCQ cases, AgentClinic doctors and the medagentbench
    react loop. The official MedAgentBench protocol is the benchmark's verbatim text: `--actions schema`
    with it is refused, `auto` leaves it text (and probes nothing)."""
    if env == "medagentbench" and (fhir_protocol or "official") == "official":
        if actions == "schema":
            raise ValueError("--actions schema: the official MedAgentBench protocol is the benchmark's own text "
                             "(GET/POST/FINISH); use --protocol react for schema-decoded turns")
        return False
    return True


@main.command()
@click.argument("cases_file", metavar="CASES.jsonl|TASKS.json", type=click.Path(dir_okay=False))
@click.option("--db", default="grandrounds.duckdb", show_default=True, help="DuckDB file holding the event log.")
@click.option("--run-id", default=None, help="Run id (default: derived from policy, backbone, seed and cases).")
@click.option("--policy", default="evo-medagent", show_default=True, help="Preset name or TOML policy file.")
@click.option("--backbone", default=None, metavar="NAME",
              help="sim, openai, record, or a backbone a plugin registers (docs/plugins.md). Default: openai when "
                   "--base-url or OPENAI_BASE_URL is set, else sim.")
@click.option("--model", default=None, help="Model name for a real backbone (with --agent: the agent's recorded name).")
@click.option("--agent", "agent_ref", default=None, metavar="MODULE:CALLABLE",
              help="Your own agent as the backbone: called as agent(case, memory), sync or async, returning an option "
                   "letter or an AgentReply. Its replies are recorded: verify and replay need neither the module nor "
                   "the callable (a replay showing it other memory does: replay --agent).")
@click.option("--base-url", default=None, help="OpenAI-compatible endpoint (else OPENAI_BASE_URL; key: OPENAI_API_KEY).")
@model_call_options
@click.option("--record-from", default=None, metavar="RUN", help="record backend: the run whose exchanges are served.")
@click.option("--record-db", default=None, help="record backend: DuckDB file holding --record-from (default: --db).")
@click.option("--live-fallthrough", is_flag=True, help="record backend: call the model on a miss instead of failing.")
@click.option("--max-steps", default=7, show_default=True, type=click.IntRange(min=1), help="Agent steps per case (openai).")
@click.option("--summary-every", default=10, show_default=True, type=click.IntRange(min=0),
              help="Summarise the whole history every W agent steps (openai, MCQ loop; 0 = off). "
                   "The retrosum policy sets its own (its summary_every, 3 in the preset).")
@click.option("--actions", type=click.Choice(["auto", "schema", "text"]), default="auto", show_default=True,
              help="openai: how agent turns are decoded (MCQ cases, AgentClinic doctor turns, the medagentbench react "
                   "loop; the official MedAgentBench protocol is always its own text). auto: probe once whether the "
                   "server enforces json_schema, then decode each turn against a schema of its legal moves where it "
                   "does (schema), else the text protocol (text). Recorded in run.started.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--lag", default=0, show_default=True, type=click.IntRange(min=0), metavar="K",
              help="Cases in flight: case i acts on the memory as of case i-1-K (its learning stages still run "
                   "in case order); with a model backbone up to K+1 cases wait on the model at once. 0 = strict "
                   "order. Recorded in run.started; the bytes depend on K, never on timing. Embedded runner only.")
@click.option("--broker", default="memory", show_default=True, help="memory (embedded) or kafka://HOST:PORT.")
@click.option("--sim-tool", "sim_tools", multiple=True, metavar="NAME=RELIABILITY",
              help="Offer a simulated tool of fixed reliability (repeatable; sim backbone).")
@click.option("--commit", type=click.Choice(["group", "case", "stage"]), default="group", show_default=True,
              help="group: one transaction per --commit-every cases or --commit-ms ms, whichever comes first "
                   "(a crash loses the uncommitted cases; the same command executes them again, to the same "
                   "bytes). case: one per case. stage: one per stage (a crash loses at most one stage).")
@click.option("--commit-every", default=64, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="--commit group: cases per transaction at most.")
@click.option("--commit-ms", default=250.0, show_default=True, type=click.FloatRange(min=0), metavar="T",
              help="--commit group: how long a finished case may wait for its transaction at most.")
@click.option("--ablation", "ablations", multiple=True, metavar="SWITCH",
              help="Apply one of the policy's ablation switches (repeatable; `grandrounds policies` lists them).")
@click.option("--memory-from", default=None, metavar="RUN",
              help="Offline mode: start from RUN's memory (train split) and keep it frozen for these cases.")
@click.option("--memory-db", default=None, help="DuckDB file holding --memory-from (default: --db).")
@click.option("--keep-learning", is_flag=True, help="With --memory-from: keep writing memory instead of freezing it.")
@click.option("--env", "env", type=click.Choice(["cases", "medagentbench", "agentclinic"]), default="cases",
              show_default=True,
              help="cases: CASES.jsonl (MCQ cases). medagentbench: TASKS.json (MedAgentBench FHIR tasks, e.g. "
                   "test_data_v2.json) acted on through FHIR functions, graded by the official refsol rules. "
                   "agentclinic: AgentClinic OSCE CASES.jsonl (doctor dialogues, graded by the judge).")
@click.option("--funcs", default=None, type=click.Path(dir_okay=False),
              help="medagentbench: funcs_v1.json (the FHIR function specs).")
@click.option("--patients", default=None, type=click.Path(dir_okay=False),
              help="medagentbench: patients_from_snapshot.json, served by a local FHIR sandbox for the run.")
@click.option("--fhir-base", default=None, metavar="URL",
              help="medagentbench: a real MedAgentBench FHIR server instead of the sandbox (grades every task type).")
@click.option("--task-type", "task_types", multiple=True, type=click.IntRange(1, 10),
              help="medagentbench: only these task types (repeatable; sandbox default 1, 2, 3, 8).")
@click.option("--protocol", "fhir_protocol", type=click.Choice(["official", "react"]), default=None,
              help="medagentbench: how a model agent acts: official (MedAgentBench's GET/POST/FINISH text protocol "
                   "and prompt, 8 rounds, memory before the prompt; the default) or react (the SkeMex-style tool-call "
                   "loop, --max-steps).")
@click.option("--max-rounds", default=None, type=click.IntRange(min=1),
              help="medagentbench, official protocol: replies per task (default 8, the official configuration).")
@click.option("--limit", default=None, type=click.IntRange(min=1),
              help="medagentbench / agentclinic: only the first N tasks or cases (after --task-type).")
@click.option("--max-turns", default=None, type=click.IntRange(min=1),
              help="agentclinic: doctor turns per case (default 20, AgentClinic's).")
@click.option("--judge-model", default=None,
              help="agentclinic (openai/record): a separate moderator model (AgentClinic's moderator_llm) asked the "
                   "official Yes/No question; recorded with the run (stage judge). Default: the run's --model.")
@click.option("--judge-base-url", default=None, metavar="URL",
              help="agentclinic: the --judge-model's endpoint (default: the run's --base-url).")
@click.option("--key-file", default=None, metavar="PATH",
              help="Sign the run's head with this key (HMAC-SHA256); default: $GRANDROUNDS_SIGNING_KEY if set. "
                   "The key is never written to the database; a key file in the database's folder is refused.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def run(cases_file, db, run_id, policy, backbone, model, agent_ref, base_url, timeout, max_attempts, record_from, record_db,
        live_fallthrough, max_steps, summary_every, actions, seed, lag, broker, sim_tools, commit, commit_every, commit_ms,
        ablations, memory_from, memory_db, keep_learning,
        env, funcs, patients, fhir_base, task_types, fhir_protocol, max_rounds, limit, max_turns, judge_model,
        judge_base_url, key_file, as_json):
    """Stream CASES.jsonl through retrieve → act → feedback → reflect → govern.

    With --env medagentbench, TASKS.json holds MedAgentBench FHIR tasks: a local FHIR sandbox serving
    --patients is started for the run (or --fhir-base names a real server) and every task goes through
    the same five stages, graded by the official refsol rules.
    """
    from grandrounds.handlers.cases import open_cases
    from grandrounds.handlers.policies.config import load_policy, with_ablations
    from grandrounds.handlers.runs import RunSpec
    from grandrounds.handlers.tools import parse_tool_spec

    from grandrounds.backbone_choice import attach_record, choose_backbone, resumed_actions, settle_actions
    from grandrounds.handlers.environments.medagentbench.run import looks_like_task_file, mab_options_given, prepare_medagentbench

    from grandrounds.store.dbfile import db_file
    from grandrounds.store.signing import load_key

    setup = None
    try:
        db_path = db_file(db)  # before anything is read or written: --db is a DuckDB file or nothing yet
        signing_key = load_key(key_file, db=db_path)  # never one kept with the database (store/signing.py)
        record_db = db_file(record_db) if record_db else None
        memory_db = db_file(memory_db) if memory_db else None
        pol = with_ablations(load_policy(policy), list(ablations))
        if env == "medagentbench":
            setup = prepare_medagentbench(cases_file, funcs, patients, fhir_base, tuple(task_types), limit,
                                          pol.name, tuple(sim_tools), broker, fhir_protocol or "official",
                                          max_rounds)
            cases, source = setup.cases, setup.source
        elif env == "agentclinic":
            from grandrounds.handlers.environments.osce_run import prepare_agentclinic

            setup = prepare_agentclinic(cases_file, max_turns, limit, pol.name, tuple(sim_tools), broker,
                                        mab_options_given(funcs, patients, fhir_base, task_types, None),
                                        judge_model, judge_base_url)
            cases, source = setup.cases, setup.source
        if env != "agentclinic" and (judge_model or judge_base_url):
            raise ValueError("--judge-model, --judge-base-url: only with --env agentclinic (AgentClinic OSCE cases)")
        if env != "medagentbench" and (fhir_protocol or max_rounds):
            raise ValueError("--protocol, --max-rounds: only with --env medagentbench (MedAgentBench FHIR tasks)")
        if env not in ("medagentbench", "agentclinic"):
            if max_turns is not None:
                raise ValueError("--max-turns: only with --env agentclinic (AgentClinic OSCE cases)")
            given = mab_options_given(funcs, patients, fhir_base, task_types, limit)
            if given:
                raise ValueError(f"{', '.join(given)}: only with --env medagentbench (MedAgentBench FHIR tasks)")
            if looks_like_task_file(cases_file):
                raise ValueError(f"{cases_file}: a JSON array, not a JSONL case file; for MedAgentBench tasks add "
                                 "--env medagentbench --funcs funcs_v1.json --patients patients_from_snapshot.json")
            cases, source = open_cases(cases_file)  # streamed: checked whole, held as offsets
        decodes = schema_actions_apply(env, fhir_protocol, actions)
        if agent_ref:  # your own agent (grandrounds/agent_ref.py): MCQ cases, embedded runner
            from grandrounds.agent_ref import agent_choice

            if env != "cases" or broker != "memory":
                raise ValueError("--agent: MCQ case files (--env cases) on the embedded runner (omit --broker)")
            choice = agent_choice(agent_ref, backbone, model)
        else:
            choice = choose_backbone(backbone, model, base_url, record_from, live_fallthrough, max_steps,
                                     summary_every, actions if decodes else "text", timeout)
        if judge_model and choice.name == "sim":
            raise ValueError("--judge-model: the sim backbone grades by string match; a judge model needs "
                             "--backbone openai (or record)")
        if memory_db and not memory_from:
            raise ValueError("--memory-db needs --memory-from RUN")
        if memory_from and not keep_learning and "writing" in type(pol).model_fields:
            pol = pol.model_copy(update={"writing": False})  # frozen: the test split reads, never writes
        note, backbone = choice.note, choice.name
        if backbone == "openai":
            from grandrounds.handlers.llm.gateway import RetryPolicy

            choice.options.update(timeout=timeout, retry=RetryPolicy(max_attempts=max_attempts))
        tools: dict[str, float] = {}
        for spec in sim_tools:
            name, r = parse_tool_spec(spec)
            tools[name] = r
        run_spec = RunSpec(policy=pol, backbone=backbone, model=choice.model, seed=seed, lag=lag, tools=tools,
                           source=source, agent=choice.agent)
        if broker != "memory":  # Kafka transport: submit, wait on the changelog, summarise
            if decodes:
                run_spec = run_spec.model_copy(update={"actions": settle_actions(choice, base_url, timeout)})
            if memory_from:
                raise ValueError("--memory-from runs on the embedded runner only (omit --broker)")
            from grandrounds.cli_kafka import run_on_kafka
            return run_on_kafka(cases, run_spec, broker=broker, db=db, run_id=run_id, note=note, as_json=as_json,
                                record_from=record_from)
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    except (ValueError, click.BadParameter) as exc:
        fail(str(exc.message if isinstance(exc, click.BadParameter) else exc), 2, as_json)

    from grandrounds.app import run_cases
    from grandrounds.streams.embedded import GroupCommit
    from grandrounds.handlers.llm.errors import ModelOutage
    from grandrounds.store.errors import GrandroundsError
    from grandrounds.store.eventstore import EventStore

    if backbone == "openai" and (not choice.record_from or live_fallthrough):
        _preflight(base_url, choice.model, as_json)  # before anything is opened or written
        if decodes:  # probe json_schema once (after the preflight), record the verdict in run.started
            try:
                # a run resumed under --actions auto keeps the mode it started with: no probe, no mismatch
                exists, recorded = resumed_actions(db_path, run_id) if actions == "auto" else (False, None)
                settled = recorded if exists else settle_actions(choice, base_url, timeout)
                run_spec = run_spec.model_copy(update={"actions": settled})
            except BAD_INPUT as exc:
                fail(str(exc), 2, as_json)
    if not os.path.exists(db_path):
        discard_on_bad_input(db_path)  # a run that ends in exit 2 leaves no new file behind
    from grandrounds.store.keyring import keys_path_for

    keys_before = keys_path_for(db_path)
    keys_existed = keys_before is not None and keys_before.exists()
    key_file = None
    try:
        with EventStore(db_path) as store:
            if choice.record_from:
                if record_db and os.path.abspath(record_db) != db_path:
                    with EventStore(record_db, read_only=True) as src:
                        attach_record(choice, src)
                else:
                    attach_record(choice, store)
                    run_id = run_id or f"{choice.record_from}-record"  # not the recorded run itself
                run_spec = run_spec.model_copy(update={"model": choice.model, "agent": choice.agent,
                                                       "actions": choice.actions})
            seeded = None
            if memory_from:
                from grandrounds.offline import seed_memory

                seeded = seed_memory(store, memory_db, memory_from, run_spec)
                run_spec = run_spec.model_copy(update={"memory_from": seeded[0]})
            bar = _progress(len(cases), as_json)
            _announce_model_load(bar)
            tally = [0, 0]  # seen, correct

            def on_case(index: int, ok: bool) -> None:
                tally[0] += 1
                tally[1] += ok
                bar.update(1)
                bar.set_postfix_str(f"acc {tally[1] / tally[0]:.2f}", refresh=False)

            try:
                with setup.environment() if setup else nullcontext() as environment:  # sandbox: up for the run
                    if judge_base_url and environment is not None:  # a judge served elsewhere (live runs only)
                        from grandrounds.handlers.backbones.build import live_transport

                        environment.judge_transport = partial(live_transport, judge_base_url, None, timeout)
                    outcome = run_cases(store, cases, run_spec, run_id=run_id, commit=commit, on_case=on_case,
                                        group=GroupCommit(cases=commit_every, ms=commit_ms),
                                        backbone_options=choice.options, seeded=seeded[1] if seeded else None,
                                        environment=environment)
            finally:
                bar.close()
                from grandrounds.store.embeddings import shared_minilm

                shared_minilm().on_load = None
            if signing_key is not None:
                from grandrounds.store.signing import sign_head

                sign_head(store, outcome.summary["run_id"], signing_key)
                outcome.summary["signed_head"] = {"key_id": signing_key.key_id}
            # What to publish to check this log later without any key (`verify --expect/--expect-head`).
            outcome.summary["chain_head"] = store.head(outcome.summary["run_id"])[1]
            key_file = _key_file_note(store, keys_existed)
    except ModelOutage as exc:
        outage_exit(exc, as_json)
    except Exception as exc:  # the one boundary: what the error is, and when it came, decide the exit
        if where_raised(exc) is not None:  # raised while a case ran (the agent's, a backbone's, a bug): never
            fail(message_of(exc) + resume_hint(db_path), 1, as_json)  # bad input; every committed case is kept
        if isinstance(exc, (*BAD_INPUT, ValueError)):
            fail(str(exc), 2, as_json)  # before any case ran (--memory-from that cannot apply): bad input
        if isinstance(exc, GrandroundsError):  # a store failure, a divergence, ...: the code its class stands for
            fail_for(exc, as_json)
        raise
    summary = outcome.summary
    notes = [n for n in (note, outcome.note) if n]
    if key_file is not None:
        summary["key_file"] = key_file
    if setup and env == "agentclinic":
        from grandrounds.handlers.environments.osce_run import SIM_NOTE as OSCE_SIM_NOTE

        notes = [OSCE_SIM_NOTE if n == outcome.note and summary["backbone"] == "sim" else n for n in notes]
    elif setup:
        from grandrounds.handlers.environments.medagentbench.run import SIM_NOTE

        notes = [SIM_NOTE if n == outcome.note and summary["backbone"] == "sim" else n for n in notes] + setup.notes
    if outcome.processed_now == 0:
        notes.append(f"run {summary['run_id']} was already complete in {db}; showing its result")
    if memory_from:
        frozen = "frozen" if not keep_learning else "still learning"
        notes.append(f"memory from run {memory_from} ({frozen})")
    if as_json:
        summary = dict(summary, db=db, notes=notes)
        click.echo(json.dumps(summary))
    else:
        click.echo(render_run(summary, db, " | ".join(notes)))
        if "per_task_type" in summary:
            click.echo("  task types   " + ", ".join(f"task{k}: {v['correct']}/{v['tasks']}"
                                                   for k, v in summary["per_task_type"].items()))
    keep_written()


def _key_file_note(store, existed_before: bool) -> dict | None:
    """Where the run's key file is, and whether this run created it (then said aloud: it is the only copy
    of the keys of the sealed case content, and it is not inside the database)."""
    if store.codec is None:
        return None
    path = store.codec.ring.path
    created = not existed_before and path.exists()
    out = {"path": str(path), "created": created}
    if created:
        out["warning"] = (f"new key file {path}: it holds the keys of this database's sealed case content and is not "
                          "inside the database; losing it loses that content for good. Keep it with the database "
                          "(mode 0600) and back it up: grandrounds keys backup --db DB --out FILE (docs/trust.md)")
    return out


def _announce_model_load(bar) -> None:
    """The first embedding loads the model (~20 s on a small machine): say so on the bar."""
    from grandrounds.store.embeddings import shared_minilm

    embedder = shared_minilm()
    if embedder.loaded or bar.disable:
        return

    def on_load(starting: bool) -> None:
        bar.set_description_str("loading the embedding model (all-MiniLM-L6-v2)" if starting else "cases")
        bar.refresh()

    embedder.on_load = on_load


def _preflight(base_url: str | None, model: str, as_json: bool) -> None:
    from grandrounds.handlers.backbones.build import endpoint_and_key
    from grandrounds.handlers.llm.errors import ModelOutage
    from grandrounds.handlers.llm.preflight import preflight

    try:
        url, key = endpoint_and_key(base_url, None)
        preflight(url, key, model)
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    except ModelOutage as exc:
        fail(f"{exc} — checked before the first case; nothing was written", 1, as_json)


def outage_exit(exc, as_json: bool) -> None:
    """A run stopped by a model outage: exit 1, naming the endpoint and the cases still to do."""
    left = getattr(exc, "cases_left", None)
    run_id = getattr(exc, "run_id", None)
    message = (f"{exc}. {left if left is not None else 'Some'} case(s) not completed because of connection or "
               f"server errors (infrastructure, not model answers); case {exc.case_id} was not recorded. "
               f"Run the same command again to resume run {run_id} from it.")
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": 1, "outage": {
            "endpoint": exc.endpoint, "kind": exc.kind, "attempts": exc.attempts, "case_id": exc.case_id,
            "stage": exc.stage, "run_id": run_id, "cases_not_completed": left}}))
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


from grandrounds.cli_convert import convert  # noqa: E402

main.add_command(convert)

from grandrounds.cli_medagentbench import medagentbench  # noqa: E402

main.add_command(medagentbench)

if __name__ == "__main__":
    main()
from grandrounds.cli_policies import policies  # noqa: E402

main.add_command(policies)

from grandrounds import cli_replay  # noqa: E402,F401
from grandrounds import cli_kafka  # noqa: E402,F401
from grandrounds import cli_privacy  # noqa: E402,F401
from grandrounds import cli_keys  # noqa: E402,F401
from grandrounds.cli_agentclinic import agentclinic  # noqa: E402
main.add_command(agentclinic)
from grandrounds.cli_model import model as model_group  # noqa: E402
main.add_command(model_group)
from grandrounds import cli_ui  # noqa: E402,F401
from grandrounds import cli_kafka_dev  # noqa: E402,F401
from grandrounds import cli_serve  # noqa: E402,F401  (serve, mcp)
