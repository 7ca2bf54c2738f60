"""Kafka commands: `worker`, `submit`, `collect`, `asyncapi`, and `run --broker kafka://…`.

Registered on the `grandrounds` group from here, so cli.py only imports this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import click

from grandrounds import cli_replay  # noqa: F401  (defines the audit group extended below)
from grandrounds.cli_group import main
from grandrounds.errors import BAD_INPUT, fail, fail_for
from grandrounds.output import render_run

_BROKER_HELP = "Kafka bootstrap servers as kafka://HOST:PORT[,HOST:PORT…]."
# The stage names as handlers/stages.py STAGE_TABLE has them (spelled out: the help is built before any
# handler is imported; tests/test_stage_table.py checks that it names exactly the table's stages).
_PREFIX_HELP = "Topic name prefix (stage topics are PREFIX + retrieve|act|feedback|reflect|govern)."


def _bootstrap(broker: str, as_json: bool) -> str:
    from grandrounds.streams.topics import BrokerUrlError, parse_broker_url

    try:
        return parse_broker_url(broker)
    except BrokerUrlError as exc:
        fail(str(exc), 2, as_json)
        raise AssertionError("unreachable")


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.ERROR if not verbose else logging.WARNING)
    logging.getLogger("grandrounds.faststream").setLevel(logging.WARNING)  # per-message and task chatter


def _fold_state(store, run_id: str):
    """Memory counts for the summary: audit's fold of the log (no embeddings needed)."""
    from grandrounds.replay.audit_common import memory_at

    return memory_at(store, run_id)


# --- run --broker kafka://… (called from cli.run) -------------------------------------------


def run_on_kafka(cases, spec, *, broker: str, db: str, run_id: str | None, note: str, as_json: bool,
                 timeout: float | None = None, prefix: str | None = None, record_from: str | None = None) -> None:
    """Submit the cases as a run, follow its changelog into `db` until every case is done, print the result.

    The result is computed from the events the worker wrote (copied into `db` from the
    changelog), so accuracy and fingerprint are the worker's, byte for byte.
    """
    from grandrounds.app import unique_run_id
    from grandrounds.cli_group import progress as _progress
    from grandrounds.handlers.backbones import make_backbone
    from grandrounds.handlers.runs import check_same_run
    from grandrounds.replay.metrics import run_summary
    from grandrounds.store.dbfile import db_file
    from grandrounds.store.eventstore import EventStore, StoreError
    from grandrounds.streams.producer import RunFailed, follow_run, submit_run
    from grandrounds.streams.topics import DEFAULT_PREFIX, Topics

    import os

    bootstrap = _bootstrap(broker, as_json)
    if record_from:
        fail("--backbone record serves a run recorded in a local database; run it with --broker memory", 2, as_json)
    # `run` has no Kafka options of its own (they would clutter the embedded case).
    topics = Topics(prefix or os.environ.get("GRANDROUNDS_KAFKA_PREFIX") or DEFAULT_PREFIX)
    if timeout is None and os.environ.get("GRANDROUNDS_KAFKA_TIMEOUT"):
        timeout = float(os.environ["GRANDROUNDS_KAFKA_TIMEOUT"])
    try:
        with EventStore(db_file(db)) as store:
            rid = run_id or unique_run_id(store, spec.default_run_id(), spec)
            asked = spec.started_event("", len(cases))
            # Like the embedded runner: a run id that names a run of another configuration is
            # refused (exit 2), here before submitting, and again once the worker's events arrive
            # (the worker's file may hold a run this file has never seen).
            if (first := store.read(rid, upto_seq=0)):
                check_same_run(first[0].decode(), asked, rid, same_embedder=False)
            bar = _progress(len(cases), as_json)
            try:
                submitted = asyncio.run(submit_run(bootstrap, rid, spec, cases, topics=topics))
                asyncio.run(follow_run(bootstrap, submitted, store, topics=topics, timeout=timeout,
                                       on_case=bar.update))
            finally:
                bar.close()
            check_same_run(store.read(rid, upto_seq=0)[0].decode(), asked, rid, same_embedder=False)
            summary = run_summary(store, rid, _fold_state(store, rid))
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    except RunFailed as exc:  # RunRejected is InvalidInput: exit 2, as the embedded runner
        fail_for(exc, as_json)
    except (StoreError, TimeoutError) as exc:
        fail(str(exc), 1, as_json)
    except Exception as exc:  # noqa: BLE001 - e.g. the broker is unreachable
        fail(f"Kafka at {bootstrap}: {exc!r}", 1, as_json)
    try:
        backbone_note = make_backbone(spec.backbone, spec.model).note
    except Exception:  # noqa: BLE001 - the backbone lives on the worker; its note is a courtesy
        backbone_note = ""
    notes = [n for n in (note, backbone_note, f"processed over Kafka ({bootstrap}, partition "
                                               f"{submitted.partition})") if n]
    if spec.lag:
        notes.append(f"lag {spec.lag}: case i acted on the memory as of case i-1-{spec.lag}, as `run --lag` "
                     "(the Kafka worker pins it; it still runs one case of a run at a time)")
    if as_json:
        click.echo(json.dumps(dict(summary, db=db, broker=broker, notes=notes)))
    else:
        click.echo(render_run(summary, db, " | ".join(notes)))


# --- worker ----------------------------------------------------------------------------------


@main.command()
@click.option("--broker", required=True, help=_BROKER_HELP)
@click.option("--db", default="grandrounds.duckdb", show_default=True,
              help="This worker's own DuckDB file (one writing process per file).")
@click.option("--group", default="grandrounds", show_default=True, help="Consumer group id.")
@click.option("--name", default=None,
              help="Stable worker name (static group membership: a restarted worker gets its partitions back "
                   "at once). Give each running worker its own.")
@click.option("--topic-prefix", default="grandrounds.", show_default=True, help=_PREFIX_HELP)
@click.option("--partitions", default=8, show_default=True, type=click.IntRange(min=1),
              help="Partitions of the topics, if this worker creates them.")
@click.option("--replication-factor", default=None, type=click.IntRange(min=1),
              help="Replication of created topics (default: min(3, brokers)).")
@click.option("--max-poll-interval-ms", default=300_000, show_default=True, type=click.IntRange(min=1000),
              help="Stages run off the poll loop, so a slow model call needs no larger value.")
@click.option("--session-timeout-ms", default=10_000, show_default=True, type=click.IntRange(min=1000))
@click.option("--base-url", default=None, help="openai backbone: endpoint (else OPENAI_BASE_URL).")
@click.option("--max-steps", default=None, type=click.IntRange(min=1), help="openai backbone: agent steps per case.")
@click.option("--agent", "agent_ref", default=None, metavar="MODULE:CALLABLE",
              help="Your own agent answers the runs submitted with --backbone agent (as `run --agent`): called as "
                   "agent(case, memory), its replies recorded, so `verify` of such a run needs no agent.")
@click.option("--model", default=None,
              help="With --agent: the name its replies are recorded under (default MODULE:CALLABLE); the worker "
                   "takes the agent runs of that model only.")
@click.option("--key-file", default=None, metavar="PATH",
              help="Sign the head of every run this worker completes with this key (else $GRANDROUNDS_SIGNING_KEY, "
                   "if set), as `grandrounds run` does; `verify --key-file` checks it. Refused if kept in --db's folder.")
@click.option("--quiet", is_flag=True, help="Log warnings only.")
@click.option("--json", "as_json", is_flag=True, help="On exit, print the worker's counters as one JSON object.")
def worker(broker, db, group, name, topic_prefix, partitions, replication_factor, max_poll_interval_ms,
           session_timeout_ms, base_url, max_steps, agent_ref, model, key_file, quiet, as_json):
    """Join the consumer group and process every run whose cases arrive (until SIGINT/SIGTERM)."""
    from grandrounds.store.eventstore import StoreError
    from grandrounds.streams.kafka_app import KafkaWorkerApp, WorkerSettings

    from grandrounds.store.dbfile import db_file

    from grandrounds.store.signing import load_key

    bootstrap = _bootstrap(broker, as_json)
    opts = {k: v for k, v in (("base_url", base_url), ("max_steps", max_steps)) if v is not None}
    agent_name = None
    try:
        db = db_file(db)
        signing_key = load_key(key_file, db=db)  # never one kept with the database (store/signing.py)
        if model and not agent_ref:
            raise ValueError("--model names the agent of --agent (a run's model comes with the run: submit --model)")
        if agent_ref:  # grandrounds/agent_ref.py: imported by name, from the working directory, as `run --agent`
            from grandrounds.agent_ref import agent_choice

            choice = agent_choice(agent_ref, None, model)
            opts.update(choice.options)
            agent_name = choice.model
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    except ValueError as exc:
        fail(str(exc), 2, as_json)
    _logging(not quiet)
    settings = WorkerSettings(bootstrap, db=db, group_id=group, name=name, prefix=topic_prefix,
                              partitions=partitions, replication_factor=replication_factor,
                              max_poll_interval_ms=max_poll_interval_ms, session_timeout_ms=session_timeout_ms,
                              backbone_opts=opts, agent_name=agent_name, tune_gc=True, preload_embedder=True,
                              signing_key=signing_key)
    app = KafkaWorkerApp(settings)
    # The worker's DuckDB commits run on a thread of their own; with the default 5 ms switch interval
    # the event loop (polling, acks, the stages) waits up to that long for the GIL each time it
    # hands it over. A shorter interval keeps both moving.
    sys.setswitchinterval(0.0005)
    try:
        asyncio.run(app.run())
    except StoreError as exc:
        fail(str(exc), 1, as_json)
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # noqa: BLE001
        fail(f"worker stopped: {exc!r}", 1, as_json)
    stats = app.worker.summary() if app.worker is not None else {}
    if as_json:
        click.echo(json.dumps(dict(stats, worker=app.worker_id, db=db, broker=broker)))
    else:
        click.echo(f"worker {app.worker_id} stopped: {stats.get('cases_completed', 0)} cases completed, "
                   f"{stats.get('skipped_redeliveries', 0)} redeliveries skipped, "
                   f"{stats.get('dead_letters', 0)} dead letters", err=True)


# --- submit ----------------------------------------------------------------------------------


@main.command()
@click.argument("cases_file", metavar="CASES.jsonl", type=click.Path(dir_okay=False))
@click.option("--broker", required=True, help=_BROKER_HELP)
@click.option("--run-id", default=None, help="Run id (default: derived from policy, backbone, seed and cases).")
@click.option("--policy", default="evo-medagent", show_default=True, help="Preset name or TOML policy file.")
@click.option("--backbone", type=click.Choice(["sim", "openai", "agent"]), default="sim", show_default=True,
              help="Backbone the worker uses (openai: configure the endpoint on the worker; agent: the workers' "
                   "own agent, `worker --agent`).")
@click.option("--model", default=None, help="Model name for the openai backbone; the agent's name for the agent "
                                             "backbone (as the workers' `--agent`, or their `--model`, names it).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--lag", default=0, show_default=True, type=click.IntRange(min=0),
              help="Case i acts on the memory as of case i-1-K (the worker pins it; same events as `run --lag K`).")
@click.option("--sim-tool", "sim_tools", multiple=True, metavar="NAME=RELIABILITY",
              help="Offer a simulated tool of fixed reliability (repeatable; sim backbone).")
@click.option("--topic-prefix", default="grandrounds.", show_default=True, help=_PREFIX_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def submit(cases_file, broker, run_id, policy, backbone, model, seed, lag, sim_tools, topic_prefix, as_json):
    """Produce CASES.jsonl as a run: its RunStart, then every case in order, keyed by run id."""
    from grandrounds.handlers.cases import open_cases
    from grandrounds.handlers.policies.config import load_policy
    from grandrounds.handlers.runs import RunSpec
    from grandrounds.handlers.tools import parse_tool_spec
    from grandrounds.streams.producer import submit_run
    from grandrounds.streams.topics import Topics

    bootstrap = _bootstrap(broker, as_json)
    try:
        cases, source = open_cases(cases_file)
        pol = load_policy(policy)
        tools = dict(parse_tool_spec(s) for s in sim_tools)
        if backbone in ("openai", "agent") and not model:
            raise ValueError(f"the {backbone} backbone needs --model")
        spec = RunSpec(policy=pol, backbone=backbone, model=model, seed=seed, lag=lag, tools=tools, source=source)
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    except ValueError as exc:
        fail(str(exc), 2, as_json)
    rid = run_id or spec.default_run_id()
    topics = Topics(topic_prefix)
    try:
        submitted = asyncio.run(submit_run(bootstrap, rid, spec, cases, topics=topics))
    except Exception as exc:  # noqa: BLE001 - e.g. the broker is unreachable
        fail(f"Kafka at {bootstrap}: {exc!r}", 1, as_json)
    out = {"run_id": rid, "cases": len(cases), "topic": topics.intake,
           "partition": submitted.partition, "broker": broker}
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(f"submitted run {rid}: {len(cases)} cases to {out['topic']} partition {out['partition']} "
                   f"({broker}); follow it with `grandrounds collect --broker {broker} --run-id {rid}`")


# --- collect ---------------------------------------------------------------------------------


@main.command()
@click.option("--broker", required=True, help=_BROKER_HELP)
@click.option("--db", default="grandrounds-audit.duckdb", show_default=True, help="Combined database to build or update.")
@click.option("--run-id", "run_ids", multiple=True, help="Only these runs (repeatable; default: every run).")
@click.option("--topic-prefix", default="grandrounds.", show_default=True, help=_PREFIX_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def collect(broker, db, run_ids, topic_prefix, as_json):
    """Build (or bring up to date) a combined audit database from the changelog topic."""
    from grandrounds.store.eventstore import EventStore, StoreError
    from grandrounds.streams.producer import collect as collect_changelog
    from grandrounds.streams.topics import Topics

    from grandrounds.store.dbfile import db_file

    bootstrap = _bootstrap(broker, as_json)
    try:
        db = db_file(db)
    except BAD_INPUT as exc:  # NotADuckDBFile (was named here without being imported: a NameError)
        fail(str(exc), 2, as_json)
    try:
        with EventStore(db) as store:
            tally = asyncio.run(collect_changelog(bootstrap, store, Topics(topic_prefix), run_ids=list(run_ids)))
            runs = [{"run_id": r.run_id, "events": r.events, "imported": tally.imported.get(r.run_id, 0),
                     "fingerprint": store.fingerprint(r.run_id)}
                    for r in store.runs() if not run_ids or r.run_id in run_ids]
    except StoreError as exc:
        fail(str(exc), 1, as_json)
    except Exception as exc:  # noqa: BLE001
        fail(f"Kafka at {bootstrap}: {exc!r}", 1, as_json)
    out = {"db": db, "runs": runs, "diverged": tally.diverged}
    if as_json:
        click.echo(json.dumps(out))
    else:
        for r in runs:
            click.echo(f"{r['run_id']:<40} {r['events']:>7} events  (+{r['imported']})  {r['fingerprint'][:16]}")
        for run_id, why in tally.diverged.items():
            click.echo(click.style(f"{run_id}: not imported: {why}", fg="red"), err=True)
    if tally.diverged:
        sys.exit(1)


# --- asyncapi --------------------------------------------------------------------------------


@main.command()
@click.option("--yaml", "as_yaml", is_flag=True, help="YAML instead of JSON.")
def asyncapi(as_yaml):
    """Print the AsyncAPI document of the Kafka topics (generated by FastStream)."""
    from grandrounds import __version__
    from grandrounds.streams.kafka_app import asyncapi_document

    click.echo(asyncapi_document("yaml" if as_yaml else "json", version=__version__), nl=False)


# `grandrounds audit collect`: the same command under the audit group (DESIGN §4: "the
# changelog also feeds a combined audit database"), when that group exists and has none.
_audit = main.commands.get("audit")
if isinstance(_audit, click.Group) and "collect" not in _audit.commands:
    _audit.add_command(collect, "collect")
