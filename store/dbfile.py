"""What `--db` may name: a DuckDB database file, or a path where none exists yet.

DuckDB's `connect` reads meaning into a path: an existing `.json`/`.jsonl`/`.csv` file is opened
as a throwaway in-memory database over that file (a run then "succeeds" and persists nothing),
`:memory:` is no file at all, and prefixes such as `md:` load an extension that reaches the
network. A path given on the command line is a file name, nothing more: `db_file` makes it
absolute (so no prefix can match) and `check_db_file` refuses anything that exists and is not a
DuckDB database file (its header carries `DUCK` at byte 8).
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import os
from pathlib import Path

DUCKDB_MAGIC = b"DUCK"
_MAGIC_AT = 8


class NotADuckDBFile(InvalidInput, ValueError):
    """`--db` names something that is not a DuckDB database file (bad input: exit code 2)."""


def is_duckdb_file(path: str | Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(_MAGIC_AT + len(DUCKDB_MAGIC))
    except OSError:
        return False
    return head[_MAGIC_AT:] == DUCKDB_MAGIC


def check_db_file(path: str | Path) -> None:
    """Refuse a path that exists and is not a DuckDB file, or whose directory does not exist."""
    p = Path(path)
    if p.is_dir():
        raise NotADuckDBFile(f"--db {str(path)!r} is a directory, not a DuckDB database file")
    if p.exists():
        if not is_duckdb_file(p):
            what = f"a {p.suffix} file" if p.suffix else "a file"
            raise NotADuckDBFile(f"--db {str(path)!r} is {what} that is not a DuckDB database; give the .duckdb file a "
                                 "run wrote, or a path where none exists yet")
    elif not p.parent.is_dir():
        raise NotADuckDBFile(f"--db {str(path)!r}: directory {str(p.parent)!r} does not exist")


def db_file(db: str | Path) -> str:
    """A command line's `--db` as the absolute path of a DuckDB file (checked; ':' is just a character)."""
    path = os.path.abspath(os.fspath(db))
    check_db_file(path)
    return path


def committed_cases(path: str | Path) -> int | None:
    """How many `case.completed` events the DuckDB file at `path` holds: 0 for no file or no events table,
    None when it cannot be read (then it must be treated as holding some)."""
    if not Path(path).exists():
        return 0
    import duckdb

    try:
        con = duckdb.connect(str(path), read_only=True)
    except Exception:  # locked by another process, not DuckDB, unreadable: never assume it is empty
        return None
    try:
        return int(con.execute("SELECT count(*) FROM events WHERE type = 'case.completed'").fetchone()[0])
    except duckdb.CatalogException:  # created, nothing written yet
        return 0
    except Exception:
        return None
    finally:
        con.close()


def remove_new_file(path: str | Path, keys_too: bool = False) -> bool:
    """Delete a database file (and its WAL) that the failing command itself created — unless it holds a
    committed case (or cannot be read to tell): no command deletes a file that holds one. `keys_too`: the
    database's key file was created by the same command, and goes with it. Returns whether it was removed."""
    if committed_cases(path) != 0:
        return False
    paths = [Path(path), Path(f"{path}.wal")] + ([Path(f"{path}.keys")] if keys_too else [])
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    return True


class ProtectedOutput(InvalidInput, ValueError):
    """An output path that names the database, its WAL or a key file (bad input: exit code 2)."""


def protected_files(db: str | Path | None, role: str = "the database") -> dict[Path, str]:
    """The files no output may replace, by what they are: the database, its WAL, its key file (`<db>.keys`
    or $GRANDROUNDS_KEYS), and $GRANDROUNDS_KEYS whatever the database."""
    from grandrounds.store.keyring import KEYS_ENV, keys_path_for

    out: dict[Path, str] = {}
    if db is not None and str(db) not in ("", ":memory:"):
        path = os.path.abspath(os.fspath(db))
        out[Path(path)] = role
        out[Path(path + ".wal")] = "the database's write-ahead log"
        keys = keys_path_for(path)
        if keys is not None:
            out[Path(os.path.abspath(keys))] = "the database's key file"
    if os.environ.get(KEYS_ENV):
        out.setdefault(Path(os.path.abspath(os.environ[KEYS_ENV])), f"the key file ${KEYS_ENV} names")
    return out


def same_file(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):  # symlinks and `..` resolved, whether or not it exists
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)  # a hard link
    except OSError:
        return False


def check_output_path(out: str | Path, db: str | Path | None = None, what: str = "--out",
                      role: str = "the database") -> Path:
    """Refuse, before anything is opened for writing, an output path that is the database, its WAL, its
    key file, or any grandrounds key file (a file whose first line is a key file header), with or without
    --force: an export written over a key file destroyed every sealed case's content. Returns the path,
    absolute."""
    from grandrounds.store.keyring import is_key_file

    path = Path(os.path.abspath(os.fspath(out)))
    for protected, name in protected_files(db, role).items():
        if same_file(path, protected):
            raise ProtectedOutput(f"{what} {str(out)!r} is {name} ({protected}); choose another file")
    if is_key_file(path):
        raise ProtectedOutput(f"{what} {str(out)!r} is a grandrounds key file (it holds the keys of sealed case "
                              "content); choose another file")
    if is_duckdb_file(path):  # another run's database: an export over it is an accident, never wanted
        raise ProtectedOutput(f"{what} {str(out)!r} is a DuckDB database; choose another file")
    return path
