"""`grandrounds replay | verify | audit | export`: order-sensitivity replays, determinism checks,
memory audit and event export (DESIGN §8). Registered onto the main command group."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from grandrounds.cli_group import main
from grandrounds.errors import BAD_INPUT, fail, fail_for

DEFAULT_DB = "grandrounds.duckdb"


def _bad_input() -> tuple[type[Exception], ...]:
    # Every replay, audit, export and verify input error is an InvalidInput (store/errors.py).
    return BAD_INPUT


def _open(db: str, as_json: bool, read_only: bool):
    from grandrounds.store.dbfile import NotADuckDBFile, db_file
    from grandrounds.store.eventstore import EventStore, StoreError

    if not Path(db).exists():
        fail(f"no database file {db!r} (give --db the file a run wrote)", 2, as_json)
    try:
        return EventStore(db_file(db), read_only=read_only)
    except NotADuckDBFile as exc:
        fail(str(exc), 2, as_json)
    except StoreError as exc:
        fail(str(exc), 1, as_json)


def _guarded(as_json: bool, fn):
    """Run `fn` at the one error boundary: an exception that escaped a case while it ran exits 1 naming the
    case (never bad input, whatever its class); bad input found before exits 2; store failures 1."""
    from grandrounds.errors import message_of, where_raised
    from grandrounds.store.eventstore import StoreError

    try:
        return fn()
    except Exception as exc:
        if where_raised(exc) is not None:  # escaped a case while it ran (the agent's, a backbone's): not bad input
            fail(message_of(exc) + "; nothing committed is lost: fix the cause and run the same command again",
                 1, as_json)
        if isinstance(exc, _bad_input()):
            fail(str(exc), 2, as_json)
        if isinstance(exc, click.BadParameter):
            fail(exc.message, 2, as_json)
        if isinstance(exc, (StoreError, OSError)):
            fail(str(exc), 1, as_json)
        raise


def _emit(obj: dict, as_json: bool, human: str | None = None) -> None:
    if as_json:
        click.echo(json.dumps(obj))
    else:
        click.echo(human if human is not None else json.dumps(obj, indent=2))


def _read_and_emit(db: str, as_json: bool, compute, render) -> None:
    """What the audit and export commands do: open the file read-only, compute from it (bad input exits 2),
    then print the result as --json or as `render` writes it, the file closed."""
    store = _open(db, as_json, read_only=True)
    with store:
        result = _guarded(as_json, lambda: compute(store))
    _emit(result, as_json, None if as_json else render(result))


def _db_option(f):
    return click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file holding the event log.")(f)


def _json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")(f)


def _key_option(f):
    return click.option("--key-file", default=None, metavar="PATH",
                        help="Signing key file (HMAC-SHA256 of run heads); default: $GRANDROUNDS_SIGNING_KEY. "
                             "Never written to the database; refused if kept in the database's folder.")(f)


def _load_key(key_file, as_json, db=None):
    from grandrounds.store.signing import SigningKeyError, load_key

    try:
        return load_key(key_file, db=db)  # a key file kept with `db` is refused (store/signing.py)
    except SigningKeyError as exc:
        fail(str(exc), 2, as_json)


# --- replay ------------------------------------------------------------------------------------


@main.command()
@_db_option
@click.option("--from", "source", required=True, metavar="RUN", help="Run whose case log is replayed.")
@click.option("--permutations", "count", default=5, show_default=True, type=int, help="Seeded case orders to run.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the permutations (not the run seed).")
@click.option("--original", is_flag=True, help="Also run the source's own order (useful with a counterfactual).")
@click.option("--policy", default=None, help="Counterfactual: preset name or TOML policy file instead of the source's.")
@click.option("--ablation", "ablations", multiple=True, metavar="SWITCH",
              help="Counterfactual switch (repeatable): no-writing, no-governance, no-valuation, similarity-only, "
                   "procedural-only, episodic-only.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Counterfactual policy field (repeatable).")
@click.option("--backbone", default=None,
              help="Counterfactual backbone (default: the source's). A run made with a model (openai/record) is "
                   "replayed from its recorded exchanges; --backbone sim replays its case log with the simulator.")
@click.option("--model", default=None, help="Counterfactual model name.")
@click.option("--tag", default=None, help="Name part for this replay's run ids (default: derived from the config).")
@click.option("--workers", default=None, type=click.IntRange(min=1),
              help="Worker processes (default: min(runs, CPU cores)); never changes results. Replays served from "
                   "a record run in this process, one run after the other.")
@click.option("--live-fallthrough", is_flag=True,
              help="Model runs: call the model for a request the source's record does not hold, instead of failing.")
@click.option("--base-url", default=None, metavar="URL",
              help="Model runs with --live-fallthrough: OpenAI-compatible endpoint (else OPENAI_BASE_URL; "
                   "key: OPENAI_API_KEY).")
@click.option("--agent", "agent_ref", default=None, metavar="MODULE:CALLABLE",
              help="A run made with your own agent (run --agent): ask it where a replay shows it memory its record "
                   "never showed it (any permutation of a run that learns). Without it such a replay stops there.")
@click.option("--baseline", type=click.Choice(["none"]), default=None,
              help="Also replay the memory-free baseline (policy none) on the same orders; reported, plotted "
                   "and in the report beside the replay.")
@click.option("--plot", "plot_path", default=None, metavar="PNG", help="Draw the curves and their mean band.")
@click.option("--report", "report_path", default=None, metavar="HTML", help="Write a self-contained HTML report.")
@click.option("--key-file", default=None, metavar="PATH",
              help="Sign the heads of the runs this replay writes (default: $GRANDROUNDS_SIGNING_KEY if set).")
@click.option("--broker", default="memory", show_default=True, metavar="memory|kafka://HOST:PORT",
              help="kafka://…: submit each permutation as a run to the `grandrounds worker` processes on that "
                   "broker (any number, any machines), follow them and copy their events into --db; the "
                   "fingerprints are those of a local replay. sim runs of MCQ cases.")
@click.option("--topic-prefix", default=None, metavar="PREFIX",
              help="With --broker kafka://: the workers' topic prefix (default: $GRANDROUNDS_KAFKA_PREFIX or "
                   "grandrounds.).")
@click.option("--kafka-timeout", default=None, type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="With --broker kafka://: give up (exit 1) when the runs are not complete after this long "
                   "(default: $GRANDROUNDS_KAFKA_TIMEOUT, else wait; a note on stderr every 30 s without progress).")
@_json_option
def replay(db, source, count, seed, original, policy, ablations, sets, backbone, model, tag, workers,
           live_fallthrough, base_url, agent_ref, baseline, plot_path, report_path, key_file, broker, topic_prefix,
           kafka_timeout, as_json):
    """Replay a run's case log in K seeded orders (order sensitivity), or under a counterfactual policy.

    A run made with a model is replayed from its recorded exchanges (exit code 1 when a
    permutation needs one the record does not hold, unless --live-fallthrough). With
    --broker kafka://HOST:PORT the permutations run on the Kafka workers instead of here.
    """
    from grandrounds.app import make_cache
    from grandrounds.replay_output import render_replay
    from grandrounds.handlers.llm.errors import ModelOutage, ReplayDivergence
    from grandrounds.handlers.policies.config import load_policy
    from grandrounds.replay.order_replay import execute_plan, plan_replay

    from grandrounds.store.dbfile import ProtectedOutput, check_output_path

    for p, what in ((plot_path, "--plot"), (report_path, "--report")):
        if p and not Path(p).resolve().parent.exists():
            fail(f"{what} {p!r}: directory does not exist", 2, as_json)
        try:  # never the database, its WAL or a key file: checked before anything runs or is written
            p and check_output_path(p, db, what)
        except ProtectedOutput as exc:
            fail(str(exc), 2, as_json)
    kafka = _kafka_target(broker, topic_prefix, kafka_timeout, as_json)
    key = _load_key(key_file, as_json, db)
    store = _open(db, as_json, read_only=False)
    with store:
        def go():
            pol = load_policy(policy) if policy else None
            agent = None
            if agent_ref:
                from grandrounds.agent_ref import load_agent

                agent = load_agent(agent_ref)
            plan = plan_replay(store, source, count, seed, policy=pol, backbone=backbone, model=model,
                               ablations=list(ablations), sets=list(sets), original=original, tag=tag)
            n_workers = workers or max(1, min(len(plan.runs), os.cpu_count() or 1))
            if agent is not None and plan.spec.backbone != "agent":
                raise click.BadParameter(f"--agent: run {source} was not made with an agent (backbone "
                                         f"{plan.spec.backbone})")
            notes = []
            if plan.served_from_record:
                notes.append(f"model run: exchanges served from the record of {source} by request hash, "
                             + ("the model called on a miss" if live_fallthrough else "no live model calls")
                             + "; runs execute one after the other in this process (workers=1)")
                if workers and workers > 1:
                    notes.append(f"--workers {workers} ignored: model clients are not sent to worker processes")
                n_workers = 1
            elif live_fallthrough or base_url:
                notes.append("--live-fallthrough/--base-url ignored: this replay calls no model")
            if plan.environment is not None:
                which = ("OSCE run: the AgentClinic environment" if plan.environment.name == "agentclinic"
                         else "FHIR run: the MedAgentBench environment")
                notes.append(f"{which} of {source} rebuilt from its recorded files "
                             "(sha256 checked), opened once; runs execute one after the other in this process "
                             "(workers=1)")
                if workers and workers > 1:
                    notes.append(f"--workers {workers} ignored: the FHIR sandbox is not sent to worker processes")
                n_workers = 1
            base_plan = None
            if baseline:
                if plan.spec.policy.name == "none":
                    raise click.BadParameter("--baseline none: this replay already runs policy none")
                base_plan = plan_replay(store, source, count, seed, policy=load_policy("none"), backbone=backbone,
                                        model=model, original=original)
            if kafka is not None:
                result = _replay_on_kafka(store, plan, base_plan, kafka, workers, notes, as_json)
                return _finish(store, result, notes, key, plot_path, report_path, db)
            bar = _progress(len(plan.runs) + (len(base_plan.runs) if base_plan else 0), "runs", as_json)
            try:
                result = execute_plan(store, make_cache(store), plan, workers=n_workers,
                                      on_run=lambda r, res: bar.update(1),
                                      live_fallthrough=live_fallthrough, base_url=base_url, agent=agent)
                if base_plan is not None:  # the same orders (same --seed), without memory
                    base = execute_plan(store, make_cache(store), base_plan, workers=n_workers,
                                        on_run=lambda r, res: bar.update(1),
                                        live_fallthrough=live_fallthrough, base_url=base_url, agent=agent)
                    result["baseline"] = {k: base[k] for k in BASELINE_KEYS}
            except ReplayDivergence as exc:
                fail(str(exc), 1, as_json)
            except ModelOutage as exc:  # live fall-through hit a dead endpoint: an outage, exit 1
                fail(f"{exc} (connection or server errors, not model answers)", 1, as_json)
            finally:
                bar.close()
            return _finish(store, result, notes, key, plot_path, report_path, db)

        result = _guarded(as_json, go)
    _emit(dict(result, db=db), as_json, None if as_json else render_replay(result, db))


def _finish(store, result: dict, notes: list[str], key, plot_path, report_path, db) -> dict:
    """What every replay does with its result, wherever its runs executed: sign, plot, report."""
    if key is not None:
        from grandrounds.store.signing import sign_head

        for r in result["runs"] + result.get("baseline", {}).get("runs", []):
            sign_head(store, r["run_id"], key)
        result["signed_by"] = key.key_id
    if notes:
        result["notes"] = notes
    if plot_path:
        from grandrounds.replay.plot import plot_curves

        plot_curves(result, plot_path)
        result["plot"] = plot_path
    if report_path:
        from grandrounds.replay.report import write_report

        write_report(store, result, db, report_path)
        result["report"] = report_path
    return result


def _kafka_target(broker: str, topic_prefix: str | None, timeout: float | None, as_json: bool):
    """`--broker`: None for `memory` (this machine), else (bootstrap, Topics, timeout); a bad URL exits 2."""
    from grandrounds.streams.topics import DEFAULT_PREFIX, BrokerUrlError, Topics, parse_broker_url

    if broker == "memory":
        if topic_prefix or timeout:
            fail("--topic-prefix and --kafka-timeout go with --broker kafka://HOST:PORT", 2, as_json)
        return None
    try:
        bootstrap = parse_broker_url(broker)
    except BrokerUrlError as exc:
        fail(str(exc), 2, as_json)
    if timeout is None and os.environ.get("GRANDROUNDS_KAFKA_TIMEOUT"):
        try:
            timeout = float(os.environ["GRANDROUNDS_KAFKA_TIMEOUT"])
        except ValueError:
            fail(f"GRANDROUNDS_KAFKA_TIMEOUT={os.environ['GRANDROUNDS_KAFKA_TIMEOUT']!r}: not a number of seconds",
                 2, as_json)
    prefix = topic_prefix or os.environ.get("GRANDROUNDS_KAFKA_PREFIX") or DEFAULT_PREFIX
    return bootstrap, Topics(prefix), timeout


def _replay_on_kafka(store, plan, base_plan, kafka, workers, notes: list[str], as_json: bool) -> dict:
    """Run the plan (and the baseline's) on the Kafka workers; exit 1 on a dead letter, a timeout or an
    unreachable broker, 2 on a plan the workers cannot run or a run id they hold with another configuration."""
    from tqdm import tqdm

    from grandrounds.replay.execute import completed_cases
    from grandrounds.replay.kafka_replay import check_kafka_plan, execute_plans_on_kafka
    from grandrounds.store.eventstore import StoreError
    from grandrounds.streams.producer import RunFailed

    bootstrap, topics, timeout = kafka
    plans = [p for p in (plan, base_plan) if p is not None]
    for p in plans:
        check_kafka_plan(p)  # bad input before anything is submitted
    if workers:
        notes.append(f"--workers {workers} ignored: the runs execute on the Kafka workers")
    notes.append(f"runs executed by the Kafka workers at kafka://{bootstrap} (topics {topics.prefix}*), "
                 "their events copied into this file from the changelog")
    runs = [r for p in plans for r in p.runs]
    bar = _progress(sum(len(r.job.cases) for r in runs), "cases", as_json)
    bar.update(sum(min(completed_cases(store, r.run_id), len(r.job.cases)) for r in runs))
    finished: list[str] = []

    def run_done(r, res) -> None:
        finished.append(r.run_id)
        bar.set_postfix_str(f"{len(finished)}/{len(runs)} runs complete")
        if not as_json:  # a line per run as well: the bar is hidden when stderr is not a terminal
            state = "already in db" if res.processed == 0 and not res.worker else f"{res.processed} cases"
            tqdm.write(f"run {r.run_id} complete ({state}; {len(finished)}/{len(runs)})", file=sys.stderr)

    def stalled(message: str) -> None:
        tqdm.write(f"waiting: {message}", file=sys.stderr)

    try:
        outs = execute_plans_on_kafka(store, plans, bootstrap, topics, timeout=timeout, on_run=run_done,
                                      on_case=bar.update, on_stall=stalled)
        result = outs[0]
        if base_plan is not None:
            result["baseline"] = {k: outs[1][k] for k in BASELINE_KEYS}
    except (*_bad_input(), TimeoutError, StoreError):
        raise  # exit 2 / exit 1 with its own message (`_guarded`)
    except RunFailed as exc:  # a dead letter: the worker could not process a permutation
        fail_for(exc, as_json)
    except Exception as exc:  # noqa: BLE001 - the Kafka client's errors, e.g. the broker is unreachable
        fail(f"Kafka at {bootstrap}: {exc!r}", 1, as_json)
    finally:
        bar.close()
    return result


BASELINE_KEYS = ("policy", "tag", "runs", "accuracy_mean", "accuracy_std", "accuracy_min", "accuracy_max",
                 "accuracy_ci95", "mean_curve", "mean_rolling", "rolling_window")
"""What `replay --baseline none` reports of the baseline's replay (its runs hold their curves)."""


def _progress(total: int, unit: str, quiet: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=unit, file=sys.stderr, disable=quiet or None, leave=False)


# --- verify ------------------------------------------------------------------------------------


@main.command()
@_db_option
@click.argument("run_id", metavar="[RUN]", required=False)
@click.option("--all", "all_runs", is_flag=True,
              help="Verify every run in the database, one after another: a result each (--json: one object a "
                   "line), exit code 1 if any run fails.")
@_key_option
@click.option("--expect", default=None, metavar="FINGERPRINT",
              help="The run's fingerprint as published elsewhere (what `grandrounds run` printed): any rewrite of "
                   "the log, truncation included, fails the check, with no key needed.")
@click.option("--expect-head", default=None, metavar="CHAIN",
              help="The run's head chain value as published elsewhere (`run` prints it as chain_head): the log "
                   "must end there.")
@_json_option
def verify(db, run_id, all_runs, key_file, expect, expect_head, as_json):
    """Check RUN's hash chain, completeness and (with a key) signed head, then re-execute it from its
    own log (a model run from its recorded exchanges) and compare.

    The database is opened read-only (re-execution goes into a scratch store), so a read-only or
    immutable copy verifies. Exit code 0 when verified (identical, complete, chain intact, signed
    head valid if a key is given, --expect/--expect-head matching), 1 otherwise, 2 on bad input (a
    key file that is missing names the file). `--json` names the cause: `reason` and `reason_codes`
    (docs/trust.md). `--all` instead of RUN verifies each run of the file.
    """
    from grandrounds.app import make_cache
    from grandrounds.replay_output import render_verify
    from grandrounds.replay.verify import verify_run, verify_runs
    from grandrounds.store.keyring import KeyRingError

    if all_runs == (run_id is not None):
        fail("give one RUN or --all", 2, as_json)
    if all_runs and (expect or expect_head):
        fail("--expect and --expect-head name one run's published values: give RUN, not --all", 2, as_json)

    for value, what in ((expect, "--expect"), (expect_head, "--expect-head")):
        if value is not None and not _looks_like_hash(value, what == "--expect-head"):
            fail(f"{what} {value!r}: not a sha256 hex digest"
                 + (" (a chain value: v2:<64 hex>)" if what == "--expect-head" else " (64 hex digits)"), 2, as_json)
    key = _load_key(key_file, as_json, db)
    store = _open(db, as_json, read_only=True)
    failed = False
    with store:
        def checked(compute):
            def go():
                try:
                    return compute()
                except KeyRingError as exc:  # key file missing or unreadable: bad input, named, never "erased"
                    _key_file_error(exc, store, as_json)

            return _guarded(as_json, go)

        if all_runs:  # one run at a time, lazily, each with a cache of its own (replay/verify.py verify_runs)
            run_ids = [r.run_id for r in store.runs()]
            if not run_ids:
                fail(f"{db} holds no runs", 2, as_json)
            pending = verify_runs(store, run_ids, make_cache, key=key)
            next_result = lambda: next(pending, None)  # noqa: E731
        else:
            single = [lambda: verify_run(store, run_id, make_cache(store), key=key, expect=expect,
                                         expect_head=expect_head)]
            next_result = lambda: single.pop()() if single else None  # noqa: E731
        while (result := checked(next_result)) is not None:
            out = result.to_dict()  # the --json object; the text rendering reads the same (values clipped)
            _emit(dict(out, db=db), as_json, None if as_json else render_verify(out))
            failed = failed or not result.ok
    if failed:
        sys.exit(1)


def _key_file_error(exc, store, as_json: bool) -> None:
    """Exit 2 for a key file that is missing or unreadable, with the file and the reason code in --json."""
    path = getattr(exc, "path", None) or (store.codec.ring.path if store.codec is not None else None)
    if as_json:
        click.echo(json.dumps({"error": str(exc), "exit_code": 2, "reason": getattr(exc, "reason", "key_missing"),
                               "key_file": None if path is None else str(path)}))
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


def _looks_like_hash(value: str, chain: bool) -> bool:
    import re

    return bool(re.fullmatch(r"(v2:)?[0-9a-fA-F]{64}" if chain else r"[0-9a-fA-F]{64}", value.strip()))


@main.command()
@_db_option
@click.argument("run_ids", metavar="RUN...", nargs=-1)
@click.option("--all", "all_runs", is_flag=True, help="Sign every run in the file.")
@click.option("--force", is_flag=True, help="Replace a head signed by another key (refused otherwise, naming that key).")
@_key_option
@_json_option
def sign(db, run_ids, all_runs, force, key_file, as_json):
    """Sign the head of RUN (last seq, event count, chain value) with the signing key.

    `run` and `replay` sign the runs they write when a key is set; this signs runs written without
    one (a Kafka worker's, an older file's) as they stand now. A head signed by another key is not
    replaced unless --force (the message names that key's id). The key is never stored.
    """
    from grandrounds.replay.caselog import UnknownRun
    from grandrounds.store.signing import SignedByAnotherKey, sign_head, signed_by

    key = _load_key(key_file, as_json, db)
    if key is None:
        fail("no signing key: set GRANDROUNDS_SIGNING_KEY or pass --key-file", 2, as_json)
    if bool(run_ids) == all_runs:
        fail("give run ids or --all (one of them)", 2, as_json)
    store = _open(db, as_json, read_only=False)
    with store:
        def go():
            ids = [r.run_id for r in store.runs()] if all_runs else list(run_ids)
            for rid in ids:
                if not store.has_run(rid):
                    raise UnknownRun(f"no run {rid!r} in {db}")
            earlier = {rid: signed_by(store, rid) for rid in ids}
            others = {rid: e for rid, e in earlier.items() if e is not None and e[0] != key.key_id}
            if others and not force:  # all refused before any is signed: no half-signed --all
                rid, (kid, seq) = next(iter(others.items()))
                raise SignedByAnotherKey(rid, kid, seq, key.key_id)
            signed = {rid: sign_head(store, rid, key, force=force).as_dict() for rid in ids}
            return {"key_id": key.key_id, "signed": signed,
                    "replaced": {rid: {"key_id": kid, "last_seq": seq} for rid, (kid, seq) in others.items()}}

        result = _guarded(as_json, go)

    def line(rid: str, h: dict) -> str:
        text = f"signed {rid}: seq {h['last_seq']}, {h['events']} events (key {result['key_id']})"
        if rid in result["replaced"]:
            was = result["replaced"][rid]
            text += f"; replaced the head signed by key {was['key_id']} at seq {was['last_seq']} (--force)"
        return text

    _emit(dict(result, db=db), as_json,
          None if as_json else "\n".join(line(rid, h) for rid, h in result["signed"].items()))


# --- audit -------------------------------------------------------------------------------------


@main.group()
def audit():
    """Memory audit: time travel, provenance, per-case explanation, run diff."""


@audit.command("items")
@_db_option
@click.argument("run_id", metavar="RUN")
@click.option("--as-of-case", type=int, default=None, metavar="N",
              help="Memory right after case index N (0-based, as explain shows) completed.")
@click.option("--as-of-seq", type=int, default=None, metavar="S", help="Memory after folding events up to seq S.")
@click.option("--kind", "kinds", multiple=True,
              type=click.Choice(["rule", "episode", "tool", "skill", "selsm-record", "experience"]),
              help="Item kinds to list (repeatable; default: all of the run's policy).")
@click.option("--status", default=None, help="Only items with this status (active, retired, stored, or a tool label).")
@click.option("--sort", type=click.Choice(["id", "utility"]), default="id", show_default=True)
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="At most N items (0: all). Default: all with --json, 40 otherwise.")
@_json_option
def audit_items(db, run_id, as_of_case, as_of_seq, kinds, status, sort, limit, as_json):
    """The memory of RUN as it was at a point of the stream, with utility and status."""
    from grandrounds.replay_output import render_items
    from grandrounds.replay.audit_items import items

    if limit is None:
        limit = 0 if as_json else 40
    _read_and_emit(db, as_json, lambda store: items(store, run_id, as_of_case, as_of_seq, list(kinds) or None,
                                                    status, sort, limit or None), render_items)


@audit.command("history")
@_db_option
@click.argument("run_id", metavar="RUN")
@click.argument("item", metavar="ITEM")
@_json_option
def audit_history(db, run_id, item, as_json):
    """Every event that touched ITEM (rule id, episode id or tool name): creation, patches, uses, utility."""
    from grandrounds.replay_output import render_history
    from grandrounds.replay.audit_history import history

    _read_and_emit(db, as_json, lambda store: history(store, run_id, item), render_history)


@audit.command("explain")
@_db_option
@click.argument("run_id", metavar="RUN")
@click.argument("case", metavar="CASE")
@_json_option
def audit_explain(db, run_id, case, as_json):
    """What CASE (a case id, or its index) retrieved, saw, answered, and changed in memory."""
    from grandrounds.replay_output import render_explain
    from grandrounds.replay.audit_explain import explain

    _read_and_emit(db, as_json, lambda store: explain(store, run_id, case), render_explain)


@audit.command("diff")
@_db_option
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="At most N items per list (0: all). Default: all with --json, 15 otherwise.")
@_json_option
def audit_diff(db, run_a, run_b, limit, as_json):
    """Memory items only in one run, and items in both with different utility or status (summary first)."""
    from grandrounds.replay_output import render_diff
    from grandrounds.replay.audit_diff import diff

    if limit is None:
        limit = 0 if as_json else 15
    _read_and_emit(db, as_json, lambda store: diff(store, run_a, run_b, limit or None),
                   lambda result: render_diff(result, limit))


# --- export ------------------------------------------------------------------------------------


@main.command()
@_db_option
@click.argument("run_ids", metavar="RUN...", nargs=-1)
@click.option("--all", "all_runs", is_flag=True, help="Export every run in the file.")
@click.option("--out", required=True, metavar="PATH", help="Output file: .parquet or .jsonl.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default=None,
              help="Default: from the extension of --out.")
@click.option("--force", is_flag=True, help="Replace --out if it exists (never the database itself).")
@_json_option
def export(db, run_ids, all_runs, out, fmt, force, as_json):
    """Export runs' events (the stored envelopes, payload and meta as JSON) to Parquet or JSON Lines."""
    from grandrounds.replay_output import render_export
    from grandrounds.replay.export import ExportError, export_runs

    def go(store):
        ids = list(run_ids)
        if all_runs:
            if ids:
                raise ExportError("give run ids or --all, not both")
            ids = [r.run_id for r in store.runs()]
        return export_runs(store, ids, out, fmt, force=force)

    _read_and_emit(db, as_json, go, render_export)
