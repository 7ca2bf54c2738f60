"""Exit codes (DESIGN §8): 0 success, 2 bad input, 1 anything else."""

from __future__ import annotations

import json
import sys

import click

from grandrounds.handlers.backbones import BackboneUnavailable
from grandrounds.handlers.cases import CaseFileError
from grandrounds.handlers.policies.config import PolicyError
from grandrounds.handlers.runs import RunMismatch
from grandrounds.store.dbfile import NotADuckDBFile
from grandrounds.store.signing import SigningKeyError

BAD_INPUT = (CaseFileError, PolicyError, RunMismatch, BackboneUnavailable, NotADuckDBFile, SigningKeyError)


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
