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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def erase(db, subject, as_json):
    """Destroy the subject's key: its case content reads as "[erased]" everywhere; the chain still verifies."""
    from grandrounds.store.erasure import NoSuchSubject, NotSealed, erase_subject
    from grandrounds.store.eventstore import EventStore, StoreError
    from grandrounds.store.keyring import KeyRingError

    if not Path(db).is_file():
        fail(f"no database file {db!r} (give --db the file a run wrote)", 2, as_json)
    try:
        with EventStore(db) as store:
            done = erase_subject(store, subject)
    except (NoSuchSubject, NotSealed, KeyRingError) as exc:
        fail(str(exc), 2, as_json)
    except StoreError as exc:
        fail(str(exc), 1, as_json)
    out = {"subject_ref": done.subject_ref, "runs": done.runs, "cases": sum(len(c) for c in done.runs.values()),
           "fingerprints_recorded": done.fingerprints}
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(f"erased subject {done.subject_ref[:12]}…: {out['cases']} case(s) in {len(done.runs)} run(s)")
        for run_id, cases in done.runs.items():
            click.echo(f"  {run_id}: {', '.join(cases)} can no longer be re-executed")
