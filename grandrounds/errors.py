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

import click

from grandrounds.store.errors import Bug, GrandroundsError, InvalidInput, Retryable

BAD_INPUT = (InvalidInput,)
"""What a command catches to exit 2 (kept as a tuple: commands add their own, e.g. click's)."""


def exit_code(exc: BaseException) -> int:
    return exc.exit_code if isinstance(exc, GrandroundsError) else 1


def message_of(exc: BaseException) -> str:
    if isinstance(exc, Bug):
        return f"{exc} (an internal error of grandrounds, not of the input: please report it)"
    if isinstance(exc, Retryable) and not isinstance(exc, InvalidInput):
        return f"{exc} (a transient failure: the same command run again resumes)"
    return str(exc)


def fail_for(exc: BaseException, as_json: bool) -> None:
    """Exit with the code and message the exception's class stands for."""
    fail(message_of(exc), exit_code(exc), as_json)


_NEW_FILES: list[str] = []


def discard_on_bad_input(path: str) -> None:
    """A file this command is about to create: if it then exits 2 (bad input), the file goes too,
    so a refused command leaves nothing behind. One command's file at a time."""
    _NEW_FILES[:] = [path]


def keep_written() -> None:
    """The command succeeded: what it created stays."""
    _NEW_FILES.clear()


def fail(message: str, code: int, as_json: bool) -> None:
    created, _NEW_FILES[:] = list(_NEW_FILES), []
    if code == 2:
        from grandrounds.store.dbfile import remove_new_file

        for path in created:
            remove_new_file(path)
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": code}))
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
