"""`grandrounds erase`: crypto-shredding of one subject's case content (store/erasure.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from grandrounds.cli_group import main
from grandrounds.errors import fail


@main.command()
@click.option("--db", required=True, help="DuckDB file holding the event log (its key file is beside it).")
@click.option("--subject", required=True,
              help="Whose content to erase: the case's `subject` (MedAgentBench: the patient's MRN), else `case:<case_id>`.")
@click.option("--run", "run_id", default=None, metavar="RUN",
              help="With `case:<case_id>`: the run (namespace) whose case it is; a case id several runs hold is "
                   "refused without it, listing them.")
@click.option("--every-run", is_flag=True, help="With `case:<case_id>`: erase that case in every run holding it.")
@click.option("--dry-run", is_flag=True, help="List what would be erased; destroy nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def erase(db, subject, run_id, every_run, dry_run, as_json):
    """Destroy the subject's key: its case content reads as "[erased]" everywhere; the chain still verifies.

    A case without a `subject` is its own subject within its run: two namespaces' case `c1` are two
    patients, and `--subject case:c1` names which with `--run` (or all with `--every-run`)."""
    from grandrounds.store.erasure import AmbiguousSubject, NoSuchSubject, NotSealed, erase_subject
    from grandrounds.store.errors import InvalidInput
    from grandrounds.store.eventstore import EventStore, StoreError
    from grandrounds.store.keyring import KeyRingError

    if not Path(db).is_file():
        fail(f"no database file {db!r} (give --db the file a run wrote)", 2, as_json)
    if run_id is not None and every_run:
        fail("--run and --every-run exclude each other", 2, as_json)
    try:
        with EventStore(db, read_only=dry_run) as store:
            done = erase_subject(store, subject, run_id=run_id, every_run=every_run, dry_run=dry_run)
    except (NoSuchSubject, AmbiguousSubject, NotSealed, KeyRingError, InvalidInput) as exc:
        fail(str(exc), 2, as_json)
    except StoreError as exc:
        fail(str(exc), 1, as_json)
    out = {"subject_ref": done.subject_ref, "runs": done.runs, "cases": sum(len(c) for c in done.runs.values()),
           "fingerprints_recorded": done.fingerprints}
    if dry_run:
        out = {"dry_run": True, **{k: v for k, v in out.items() if k != "fingerprints_recorded"}}
    if as_json:
        click.echo(json.dumps(out))
    elif dry_run:
        click.echo(f"would erase subject {done.subject_ref[:12]}…: {out['cases']} case(s) in {len(done.runs)} run(s)"
                   " (dry run: nothing destroyed)")
        for rid, cases in done.runs.items():
            click.echo(f"  {rid}: {', '.join(cases)}")
    else:
        click.echo(f"erased subject {done.subject_ref[:12]}…: {out['cases']} case(s) in {len(done.runs)} run(s)")
        for rid, cases in done.runs.items():
            click.echo(f"  {rid}: {', '.join(cases)} can no longer be re-executed")
