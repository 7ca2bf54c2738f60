"""`grandrounds keys backup | restore`: custody of a database's key file (store/keyring.py).

The key file (`<db>.keys`, or $GRANDROUNDS_KEYS) holds the only copy of the keys that open the sealed
case content; it is not inside the database, so a database copied, moved or backed up without it
has lost that content. These commands copy it out and put it back, atomically and 0600, and never
overwrite a key file with anything that holds less (docs/trust.md, "Key custody").
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from grandrounds.cli_group import main
from grandrounds.errors import fail


@main.group()
def keys():
    """Back up and restore a database's key file (the keys of its sealed case content)."""


def _db(db: str, as_json: bool) -> str:
    from grandrounds.store.dbfile import NotADuckDBFile, db_file

    if not Path(db).is_file():
        fail(f"no database file {db!r} (give --db the file a run wrote)", 2, as_json)
    try:
        return db_file(db)
    except NotADuckDBFile as exc:
        fail(str(exc), 2, as_json)


def _key_file(db_path: str, as_json: bool) -> Path:
    from grandrounds.store.keyring import keys_path_for

    path = keys_path_for(db_path)
    if path is None:
        fail(f"{db_path}: an in-memory database has no key file", 2, as_json)
    return Path(path)


def _refuse_protected(path: Path, db_path: str, what: str, as_json: bool) -> None:
    """The database and its WAL are never a key file's backup or source; nor is any DuckDB file."""
    from grandrounds.store.dbfile import is_duckdb_file, protected_files, same_file

    for protected, name in protected_files(db_path).items():
        if "key file" in name:
            continue  # the key file itself: backup/restore say so in their own words
        if same_file(path, protected):
            fail(f"{what} {str(path)!r} is {name} ({protected}); choose another file", 2, as_json)
    if is_duckdb_file(path):
        fail(f"{what} {str(path)!r} is a DuckDB database, not a key file", 2, as_json)


def _emit(out: dict, as_json: bool, human: str) -> None:
    click.echo(json.dumps(out) if as_json else human)


@keys.command("backup")
@click.option("--db", required=True, help="DuckDB file whose key file is backed up.")
@click.option("--out", required=True, metavar="FILE",
              help="Where the copy goes (written 0600; an existing file only if it is an older backup of the same "
                   "key file, or identical).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def backup(db, out, as_json):
    """Copy the database's key file to FILE, atomically and 0600.

    A backup taken before `grandrounds erase` still holds the erased subject's key: take a new one
    after an erasure and destroy the older ones (docs/trust.md).
    """
    from grandrounds.store.keyring import KeyRingError, backup_key_file

    db_path = _db(db, as_json)
    key_file = _key_file(db_path, as_json)
    target = Path(out).absolute()
    _refuse_protected(target, db_path, "--out", as_json)
    if not target.parent.is_dir():
        fail(f"--out {out!r}: directory {str(target.parent)!r} does not exist", 2, as_json)
    try:
        result = backup_key_file(key_file, target)
    except KeyRingError as exc:
        fail(str(exc), 2, as_json)
    except OSError as exc:
        fail(f"--out {out!r}: {exc.strerror or exc}", 1, as_json)
    _emit(dict(result, db=db), as_json,
          f"key file {result['key_file']} backed up to {result['backup']}: {result['action']} "
          f"({result['subjects']} subject key(s), {result['erased']} erasure tombstone(s), mode {result['mode'][2:]})")


@keys.command("restore")
@click.option("--db", required=True, help="DuckDB file whose key file is restored.")
@click.argument("backup_file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def restore(db, backup_file, as_json):
    """Put FILE (a `keys backup`) in place as the database's key file, atomically and 0600.

    An existing key file is replaced only by a backup that holds every key and tombstone it holds
    (the union is written); keys of subjects the database records as erased are left out, so a
    restore never undoes `grandrounds erase`. The database is only read.
    """
    from grandrounds.store.eventstore import EventStore, StoreError
    from grandrounds.store.keyring import KeyRingError, restore_key_file

    db_path = _db(db, as_json)
    key_file = _key_file(db_path, as_json)
    source = Path(backup_file).absolute()
    if not source.is_file():
        fail(f"{backup_file}: file not found", 2, as_json)
    _refuse_protected(source, db_path, "FILE", as_json)
    try:
        with EventStore(db_path, read_only=True, codec=None) as store:
            sealed, erased = _subject_refs(store)
        result = restore_key_file(source, key_file, erased, sealed)
    except KeyRingError as exc:
        fail(str(exc), 2, as_json)
    except StoreError as exc:
        fail(str(exc), 1, as_json)
    except OSError as exc:
        fail(f"{key_file}: {exc.strerror or exc}", 1, as_json)
    lines = [f"key file {result['key_file']} restored from {result['backup']}: {result['action']} "
             f"({result['subjects']} subject key(s), {result['erased']} erasure tombstone(s), mode {result['mode'][2:]})"]
    if result["erased_keys_withheld"]:
        lines.append(f"  left out {result['erased_keys_withheld']} key(s) of subjects this database records as "
                     "erased (the backup predates the erasure)")
    if result["sealed_subjects_without_key"]:
        lines.append(click.style(f"  warning: {result['sealed_subjects_without_key']} of {result['sealed_subjects']} "
                                 "subjects of sealed content have no key in it: that content stays unreadable "
                                 "(verify reports key_missing)", fg="yellow"))
    _emit(dict(result, db=db), as_json, "\n".join(lines))


def _subject_refs(store) -> tuple[set[str], set[str]]:
    """(subject refs the database's sealed rows name, refs its `erasures` table records as erased)."""
    from grandrounds.store.erasure import subject_refs

    return subject_refs(store)
