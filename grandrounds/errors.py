"""Exit codes (DESIGN §8): 0 success, 2 bad input, 1 anything else; mapped here and only here.

What an exception means for the caller is its class in the root hierarchy (store/errors.py):
`InvalidInput` exits 2 and removes a file the command created; `Retryable` and `Bug` exit 1 with a
word on what to do; any other `GrandroundsError` exits 1. The command group (`cli_group.Main`)
maps whatever a command lets escape; commands that want a more specific message (the model
outage's resume hint) catch first and call `fail` themselves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from grandrounds.store.errors import Bug, GrandroundsError, InvalidInput, Retryable, where_raised  # noqa: F401 (re-exported)

BAD_INPUT = (InvalidInput,)
"""What a command catches to exit 2 (kept as a tuple: commands add their own, e.g. click's)."""


def exit_code(exc: BaseException) -> int:
    return exc.exit_code if isinstance(exc, GrandroundsError) else 1


def resume_hint(db: str) -> str:
    """What a run that failed after it began says about its file: what is kept, and how to go on."""
    from grandrounds.store.dbfile import committed_cases

    kept = committed_cases(db)
    held = f"{kept} committed case(s) kept in {db}" if kept else f"{db} kept"
    return f"; {held}: fix the cause and run the same command again to resume"


def message_of(exc: BaseException) -> str:
    where = where_raised(exc)
    text = str(exc) or type(exc).__name__
    if where and not isinstance(exc, GrandroundsError):  # someone else's exception: name it and where it came from
        text = f"{type(exc).__name__} {where}: {text}"
    elif where:
        text = f"{text} ({where})"
    if isinstance(exc, Bug):
        return f"{text} (an internal error of grandrounds, not of the input: please report it)"
    if isinstance(exc, Retryable) and not isinstance(exc, InvalidInput):
        return f"{text} (a transient failure: the same command run again resumes)"
    return text


def fail_for(exc: BaseException, as_json: bool) -> None:
    """Exit with the code and message the exception's class stands for."""
    fail(message_of(exc), exit_code(exc), as_json)


_NEW_FILES: list[tuple[str, bool]] = []


def discard_on_bad_input(path: str) -> None:
    """A file this command is about to create: if it then exits 2 (bad input), the file goes too (and its
    key file, when this command made that as well), so a refused command leaves nothing behind — unless
    the file holds a committed case by then: it stays, and the exit is 1 (`fail`). One file at a time."""
    from grandrounds.store.keyring import keys_path_for

    keys = keys_path_for(path)
    _NEW_FILES[:] = [(path, keys is not None and keys == Path(f"{path}.keys") and not keys.exists())]


def keep_written() -> None:
    """The command succeeded: what it created stays."""
    _NEW_FILES.clear()


def fail(message: str, code: int, as_json: bool) -> None:
    """Exit with `code`. Exit 2 means bad input and nothing left behind: a file this command created goes,
    unless it holds a committed case by now — then it is kept, whatever was asked, and the exit is 1 with
    the count kept and how to resume (an error after the first commit is never 'bad input')."""
    created, _NEW_FILES[:] = list(_NEW_FILES), []
    if code == 2:
        from grandrounds.store.dbfile import remove_new_file

        for path, keys_too in created:
            if not remove_new_file(path, keys_too=keys_too):
                code = 1
                message += resume_hint(path)
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": code}))
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
